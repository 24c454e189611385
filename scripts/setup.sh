#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages, then LibTorch from the torch==2.11.0 wheel
# in a project-local virtual environment (or an existing torch install when one is there, as on
# many GPU machines), the wandb client for --wandb-project and transformers for the Hugging Face
# tests. Writes .setup/env.sh, which the other scripts source.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TORCH_VERSION=2.11.0
WANDB_VERSION=0.31.0
TRANSFORMERS_VERSION=5.25.0

log() { echo "[setup] $*"; }

# --- 1. system packages ----------------------------------------------------------------------
PKGS=(cmake ninja-build ccache g++ libcli11-dev nlohmann-json3-dev libspdlog-dev libgtest-dev
      libopenmpi-dev openmpi-bin python3-venv libsentencepiece-dev libpcre2-dev libxxhash-dev)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})) && [ "${FP8TRON_SKIP_APT:-0}" != 1 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    log "installing Debian packages: ${missing[*]}"
    if ! { timeout 300 $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 $SUDO apt-get install \
           -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
      log "warning: apt-get could not install ${missing[*]}; continuing with what is installed"
    fi
  else
    log "warning: no apt-get; make sure these are installed: ${missing[*]}"
  fi
fi

# A machine without apt access can bring header-only packages as .deb files:
# FP8TRON_DEB_DIR=<dir with e.g. libxxhash-dev_*.deb> unpacks them into .setup/sysroot, where
# cmake/Dependencies.cmake looks too.
if [ -n "${FP8TRON_DEB_DIR:-}" ]; then
  mkdir -p .setup/sysroot
  for f in "$FP8TRON_DEB_DIR"/*.deb; do [ -f "$f" ] && dpkg -x "$f" .setup/sysroot && log "unpacked $(basename "$f") into .setup/sysroot"; done
fi

# --- 2. LibTorch (from the torch wheel) ----------------------------------------------------------
has_torch() { "$1" -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" >/dev/null 2>&1; }
PY=""
for cand in "${FP8TRON_PYTHON:-}" "$ROOT/.venv/bin/python" python3 /opt/torch/.venv/bin/python3; do
  [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && has_torch "$cand" && { PY=$(command -v "$cand"); break; }
done
if [ -z "$PY" ]; then
  log "installing torch==$TORCH_VERSION into $ROOT/.venv (a few GB, once)"
  [ -x "$ROOT/.venv/bin/python" ] || python3 -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/python" -m pip install -q --upgrade pip
  "$ROOT/.venv/bin/python" -m pip install -q "torch==$TORCH_VERSION"
  PY="$ROOT/.venv/bin/python"
fi
log "using torch from $PY"

# --- 3. the wandb client (--wandb-project) -------------------------------------------------------
# The trainer logs to W&B through a Python side process (trainer/logging/wandb_logger.py) that
# needs only wandb: it goes into the project's .venv, made here when torch came from elsewhere.
# Without it training still works; --wandb-project then stops at start-up naming this script.
# An existing .venv without wandb (made before W&B logging) gets it here too.
WANDB_PY=${FP8TRON_WANDB_PYTHON:-$ROOT/.venv/bin/python}
if [ "$WANDB_PY" = "$ROOT/.venv/bin/python" ] && [ ! -x "$WANDB_PY" ]; then
  python3 -m venv "$ROOT/.venv" || log "warning: could not create $ROOT/.venv for wandb"
fi
if ! "$WANDB_PY" -c "import wandb" >/dev/null 2>&1; then
  log "installing wandb==$WANDB_VERSION for $WANDB_PY (W&B logging)"
  "$WANDB_PY" -m pip install -q "wandb==$WANDB_VERSION" ||
    log "warning: could not install wandb for $WANDB_PY; --wandb-project needs it (everything else works)"
fi
# transformers, for the Hugging Face import/export tests (tests/trainer/hf_import_test.py,
# scripts/check_hf_export.py); fp8tron-import and fp8tron-export themselves do not need it.
if ! "$WANDB_PY" -c "import transformers" >/dev/null 2>&1; then
  log "installing transformers==$TRANSFORMERS_VERSION for $WANDB_PY (Hugging Face tests)"
  "$WANDB_PY" -m pip install -q "transformers==$TRANSFORMERS_VERSION" ||
    log "warning: could not install transformers for $WANDB_PY; the hf tests will be skipped (everything else works)"
fi

# --- 3b. the cuDNN frontend headers (--fp8-dot-product-attention) ---------------------------------
# Header-only; taken from the nvidia-cudnn-frontend wheel into .setup/cudnn_frontend (a machine
# without PyPI can point FP8TRON_WHEEL_DIR at a directory holding that wheel). Without them the
# build works and the flag fails naming this script.
CUDNN_FRONTEND_VERSION=1.32.0
CFE="$ROOT/.setup/cudnn_frontend"
if [ ! -f "$CFE/include/cudnn_frontend.h" ]; then
  log "fetching the cuDNN frontend $CUDNN_FRONTEND_VERSION headers (FP8 attention)"
  tmp=$(mktemp -d)
  if ls "${FP8TRON_WHEEL_DIR:-/nonexistent}"/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
    cp "$FP8TRON_WHEEL_DIR"/nvidia_cudnn_frontend-*.whl "$tmp"/
  else
    "$PY" -m pip download -q --no-deps "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" -d "$tmp" >/dev/null 2>&1 || true
  fi
  if ls "$tmp"/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
    "$PY" - "$tmp" "$CFE" <<'PYEOF'
import glob, sys, zipfile
wheel = sorted(glob.glob(sys.argv[1] + "/nvidia_cudnn_frontend-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PYEOF
  else
    log "warning: could not fetch nvidia-cudnn-frontend; --fp8-dot-product-attention will be unavailable"
  fi
  rm -rf "$tmp"
fi

# --- 4. paths for CMake and the run-time loader ------------------------------------------------------
eval "$("$PY" - <<'PYEOF'
import os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
nv = os.path.join(site, "nvidia")
def q(s): return "'" + s.replace("'", "'\\''") + "'"
print("TORCH_PREFIX=" + q(torch.utils.cmake_prefix_path))
print("TORCH_LIB=" + q(os.path.join(os.path.dirname(torch.__file__), "lib")))
print("NV_ROOT=" + q(nv))
PYEOF
)"
nccl_root=""
for d in "$NV_ROOT/nccl" "$NV_ROOT/cu13"; do [ -f "$d/include/nccl.h" ] && { nccl_root="$d"; break; }; done
cudnn_inc=""
for d in "$NV_ROOT/cudnn/include" "$NV_ROOT/cu13/include"; do [ -f "$d/cudnn.h" ] && { cudnn_inc="$d"; break; }; done
ld_extra="$TORCH_LIB"
for d in "$NV_ROOT"/*/lib; do [ -d "$d" ] && ld_extra="$ld_extra:$d"; done

mkdir -p .setup
cat > .setup/env.sh <<ENVEOF
# written by scripts/setup.sh
export FP8TRON_PYTHON='$PY'
export FP8TRON_WANDB_PYTHON='$WANDB_PY'
export FP8TRON_TORCH_PREFIX='$TORCH_PREFIX'
export FP8TRON_NCCL_ROOT='$nccl_root'
export FP8TRON_CUDNN_INCLUDE='$cudnn_inc'
export LD_LIBRARY_PATH='$ld_extra'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ENVEOF
log "wrote .setup/env.sh (NCCL: ${nccl_root:-not found}, cuDNN headers: ${cudnn_inc:-not found})"
