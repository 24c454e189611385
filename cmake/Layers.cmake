# One static library per folder, and the layering of docs/architecture.md enforced by the compiler.
#
# A library does not put the source root on its include path. It publishes an "include view":
# a directory under the build tree holding symbolic links to the headers of its own folder(s)
# only, at their usual paths ("models/gpt_model.h"). Targets that link the library see the view
# through CMake's usage requirements, so a translation unit can include exactly the headers of the
# libraries it links, directly or through their public links. An include that goes up a layer
# (models/ -> trainer/, data/ -> models/) fails to compile with "No such file or directory"
# instead of building by accident.
#
#   fp8tron_add_layer(<target> FOLDERS <folder>... SOURCES <file>... [PUBLIC <lib>...] [PRIVATE <lib>...]
#                     [TORCH])
# FOLDERS are relative to the source root; their *.h, *.cuh and *.inc files are linked (not their
# subfolders: a subfolder is its own library). TORCH: the library uses LibTorch and reuses the
# precompiled LibTorch header of fp8tron_pch for its C++ sources.

set(FP8TRON_INCLUDE_VIEWS ${PROJECT_BINARY_DIR}/include_views)

function(fp8tron_publish_headers target)
  set(view ${FP8TRON_INCLUDE_VIEWS}/${target})
  file(REMOVE_RECURSE ${view})
  foreach(folder ${ARGN})
    file(GLOB headers CONFIGURE_DEPENDS
         ${PROJECT_SOURCE_DIR}/${folder}/*.h ${PROJECT_SOURCE_DIR}/${folder}/*.cuh ${PROJECT_SOURCE_DIR}/${folder}/*.inc)
    file(MAKE_DIRECTORY ${view}/${folder})
    foreach(header ${headers})
      get_filename_component(name ${header} NAME)
      file(CREATE_LINK ${header} ${view}/${folder}/${name} SYMBOLIC)
    endforeach()
  endforeach()
  target_include_directories(${target} PUBLIC ${view})
endfunction()

function(fp8tron_add_layer target)
  cmake_parse_arguments(L "TORCH" "" "FOLDERS;SOURCES;PUBLIC;PRIVATE" ${ARGN})
  add_library(${target} STATIC ${L_SOURCES})
  # CUDA sources compile one by one: CMake >= 3.31 would batch them too, and the kernels' private
  # helpers (block sizes, vector widths) share names across files.
  set(cuda_sources ${L_SOURCES})
  list(FILTER cuda_sources INCLUDE REGEX "\\.cu$")
  if(cuda_sources)
    set_source_files_properties(${cuda_sources} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  fp8tron_publish_headers(${target} ${L_FOLDERS})
  target_link_libraries(${target} PUBLIC ${L_PUBLIC} PRIVATE ${L_PRIVATE})
  if(L_TORCH)
    target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
    fp8tron_use_torch_pch(${target})
  endif()
endfunction()

# The LibTorch precompiled header, built once (fp8tron_pch) and reused by every torch target.
function(fp8tron_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM fp8tron_pch)
endfunction()
