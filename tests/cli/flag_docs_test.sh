#!/usr/bin/env bash
# docs/flags.md must be exactly what fp8tron-flag-table prints from the flag table (regenerate it
# with scripts/update_flag_docs.sh).
# Usage: flag_docs_test.sh FP8TRON_FLAG_TABLE FLAGS_MD
set -u
TOOL=$1 DOC=$2
[ -f "$DOC" ] || { echo "FAIL: $DOC does not exist; run scripts/update_flag_docs.sh"; exit 1; }
if ! diff <("$TOOL") "$DOC" >/dev/null; then
  echo "FAIL: $DOC differs from the flag table; run scripts/update_flag_docs.sh"
  diff <("$TOOL") "$DOC" | head -20
  exit 1
fi
echo "ok: $DOC matches the flag table"
