# Finds every dependency fp8tron builds against. scripts/setup.sh installs them and writes
# .setup/env.sh, whose variables are read here when the cache does not set them.
if(NOT CMAKE_PREFIX_PATH AND DEFINED ENV{FP8TRON_TORCH_PREFIX})
  list(APPEND CMAKE_PREFIX_PATH $ENV{FP8TRON_TORCH_PREFIX})
endif()
if(NOT NCCL_ROOT AND DEFINED ENV{FP8TRON_NCCL_ROOT})
  set(NCCL_ROOT $ENV{FP8TRON_NCCL_ROOT})
endif()
if(NOT CUDNN_INCLUDE_PATH AND DEFINED ENV{FP8TRON_CUDNN_INCLUDE})
  set(CUDNN_INCLUDE_PATH $ENV{FP8TRON_CUDNN_INCLUDE} CACHE PATH "cuDNN headers")
endif()
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90a)  # H100/H200: wgmma and FP8 tensor cores need sm_90a
endif()
set(TORCH_CUDA_ARCH_LIST "9.0a" CACHE STRING "")

find_package(Torch REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(spdlog REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(CUDAToolkit REQUIRED)

# XXH3 checksums of checkpoint tensors: xxHash from Debian's libxxhash-dev, used header-only
# (XXH_INLINE_ALL in checkpoint/checksum.cpp), so nothing but the header is needed. A
# machine without apt can unpack the package's .deb into .setup/sysroot (dpkg -x).
find_path(XXHASH_INCLUDE_DIR xxhash.h HINTS ${PROJECT_SOURCE_DIR}/.setup/sysroot/usr/include)
if(NOT XXHASH_INCLUDE_DIR)
  message(FATAL_ERROR "xxhash.h not found: install libxxhash-dev (scripts/setup.sh does), or unpack its .deb with "
                      "`dpkg -x libxxhash-dev_*.deb ${PROJECT_SOURCE_DIR}/.setup/sysroot`")
endif()
add_library(fp8tron_xxhash INTERFACE)
target_include_directories(fp8tron_xxhash SYSTEM INTERFACE ${XXHASH_INCLUDE_DIR})

# NCCL from the torch wheel (nvidia/nccl); the wheel has only libnccl.so.2, no dev symlink.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT}/include REQUIRED)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${NCCL_ROOT}/lib REQUIRED)
add_library(fp8tron_nccl INTERFACE)
target_include_directories(fp8tron_nccl INTERFACE ${NCCL_INCLUDE_DIR})
target_link_libraries(fp8tron_nccl INTERFACE ${NCCL_LIBRARY})
# cuDNN's FP8 attention (fp8/cudnn_sdpa.cpp): the header-only cuDNN frontend, fetched by
# scripts/setup.sh into .setup/cudnn_frontend, and libcudnn from the torch wheel (libcudnn.so.9,
# no dev symlink). Optional: without them --fp8-dot-product-attention fails naming setup.sh.
if(NOT CUDNN_FRONTEND_INCLUDE_DIR AND DEFINED ENV{FP8TRON_CUDNN_FRONTEND_INCLUDE})
  set(CUDNN_FRONTEND_INCLUDE_DIR $ENV{FP8TRON_CUDNN_FRONTEND_INCLUDE})
endif()
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${PROJECT_SOURCE_DIR}/.setup/cudnn_frontend/include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${CUDNN_INCLUDE_PATH}/../lib)
message(STATUS "fp8tron: cuDNN frontend ${CUDNN_FRONTEND_INCLUDE_DIR}, cuDNN ${CUDNN_LIBRARY}")
message(STATUS "fp8tron: NCCL ${NCCL_LIBRARY}, cuDNN headers ${CUDNN_INCLUDE_PATH}, torch ${Torch_DIR}")
