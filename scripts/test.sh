#!/usr/bin/env bash
# Set up, build, and run every test (unit, multi-process, GPU tests when a GPU is present).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
start=$(date +%s)
./scripts/setup.sh
setup_done=$(date +%s)
./scripts/build.sh
build_done=$(date +%s)
source .setup/env.sh
cd "${FP8TRON_BUILD_DIR:-build}"
# One intra-op thread per test process: ctest runs two at a time on the 2-core machines.
OMP_NUM_THREADS=1 ctest --output-on-failure -j "${FP8TRON_TEST_JOBS:-$(nproc)}" "$@"
end=$(date +%s)
echo "test.sh: done in $((end - start)) s (setup $((setup_done - start)) s, build $((build_done - setup_done)) s," \
     "tests $((end - build_done)) s)"
