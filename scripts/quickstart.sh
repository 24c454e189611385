#!/usr/bin/env bash
# Set up, build, then train a tiny GPT on the built-in dataset (GPU if present, else CPU).
# Extra arguments are passed to fp8tron, e.g. `./scripts/quickstart.sh --train-iters 100`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
./scripts/setup.sh
./scripts/build.sh fp8tron
source .setup/env.sh
exec ./build/fp8tron --config configs/tiny.json "$@"
