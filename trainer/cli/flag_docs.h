// docs/flags.md, generated from the flag table so that it cannot drift (build/fp8tron-flag-table
// prints it; tests/cli/flag_docs_test.sh checks the file against it).
#pragma once
#include <string>

namespace fp8tron {

// Markdown: every Megatron-LM flag, one row per flag, in sections by support level (in table
// order), then fp8tron's own flags.
std::string megatron_flag_table_markdown();

}  // namespace fp8tron
