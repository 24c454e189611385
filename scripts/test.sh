#!/usr/bin/env bash
# Set up, build, and run every test (unit, multi-process, GPU tests when a GPU is present).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
start=$(date +%s)
./scripts/setup.sh
./scripts/build.sh
source .setup/env.sh
cd "${FP8TRON_BUILD_DIR:-build}"
# One intra-op thread per test process: ctest runs two at a time on the 2-core machines.
OMP_NUM_THREADS=1 ctest --output-on-failure -j "${FP8TRON_TEST_JOBS:-$(nproc)}" "$@"
echo "test.sh: done in $(( $(date +%s) - start )) s"
