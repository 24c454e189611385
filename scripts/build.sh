#!/usr/bin/env bash
# Configure and build into build/ (or $FP8TRON_BUILD_DIR). Extra arguments go to the build tool,
# e.g. `./scripts/build.sh fp8tron` builds only the trainer.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .setup/env.sh ] || ./scripts/setup.sh
source .setup/env.sh
BUILD=${FP8TRON_BUILD_DIR:-build}
JOBS=${FP8TRON_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$ROOT/.ccache}
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FP8TRON_CMAKE_ARGS:-}
fi
cmake --build "$BUILD" -j "$JOBS" ${1:+--target "$@"}
