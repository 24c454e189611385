#!/usr/bin/env bash
# Runs one shard of a GoogleTest binary (GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX in the environment,
# tests/CMakeLists.txt's fp8tron_add_gtests) and exits 77, which ctest reports as skipped, when
# the shard passed without running a test (every one skipped: GPU tests on a machine without one).
# Usage: gtest_shard.sh BINARY [gtest flags...]
set -o pipefail
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
rc=$?
if [ $rc = 0 ] && grep -q '^\[  PASSED  \] 0 tests' "$out"; then exit 77; fi
exit $rc
