// fp8tron-flag-table: prints docs/flags.md, the Megatron-LM flags by support level, generated
// from the flag table (trainer/cli/flag_docs.h).
#include <cstdio>

#include "trainer/cli/flag_docs.h"

int main() {
  std::fputs(fp8tron::megatron_flag_table_markdown().c_str(), stdout);
  return 0;
}
