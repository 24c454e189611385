#!/usr/bin/env bash
# Regenerates docs/flags.md, the Megatron-LM flags by support level, from the flag table
# (build/fp8tron-flag-table; build it first: ./scripts/build.sh fp8tron-flag-table).
# Usage: scripts/update_flag_docs.sh [FP8TRON_FLAG_TABLE]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOL=${1:-$ROOT/build/fp8tron-flag-table}
"$TOOL" >"$ROOT/docs/flags.md.tmp"
mv "$ROOT/docs/flags.md.tmp" "$ROOT/docs/flags.md"
