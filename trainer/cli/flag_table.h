// The declarative table of every command-line flag fp8tron knows: Megatron-LM's names, kinds and
// defaults, and what fp8tron does with each. Only trainer/ reads flags; everything else takes the
// typed structs of core/config/.
#pragma once
#include <string>
#include <vector>

namespace fp8tron {

enum class FlagKind {
  Int,
  Float,
  String,
  Bool,     // store_true: present = true (`--no-x` flags are Bool too; their consumer inverts)
  IntList,  // nargs='+' / '*'
  FloatList,
  StringList,
};

enum class Support {
  Yes,          // implemented with Megatron's meaning
  NotYet,       // parsed and validated; using it fails with "not supported yet: --flag" (note names the feature)
  HintOnly,     // logging or performance hint only: accepted with a one-line warning (note says why)
  Unsupported,  // changes the model or the math and is not implemented: using it is an error
};

struct FlagSpec {
  const char* name;           // without the leading "--"
  FlagKind kind;
  const char* default_value;  // Megatron's default as text; "" means None / unset
  Support support;
  const char* note;           // NotYet: the feature; HintOnly/Unsupported: why
  const char* choices;        // "a|b|c", or "" for any value
  const char* help;
};

const std::vector<FlagSpec>& flag_table();
const FlagSpec* find_flag(const std::string& name);
std::vector<std::string> all_flag_names();
// The hidden flags of fp8tron's own test suites (--fp8tron-test-*): accepted, but not listed by
// --help nor among the arguments a run prints and saves unless given.
bool is_test_flag(const FlagSpec& spec);

}  // namespace fp8tron
