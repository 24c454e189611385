// The README's table of Megatron-LM flags by support level, generated from the flag table so
// that it cannot drift (build/fp8tron-flag-table prints it; tests/readme_flag_table_test.sh checks
// the README against it).
#pragma once
#include <string>

namespace fp8tron {

// Markdown: one row per (support level, reason), the flags of each row in table order.
std::string megatron_flag_table_markdown();

}  // namespace fp8tron
