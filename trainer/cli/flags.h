// Command line + JSON config -> raw flag values, checked against the flag table (names, kinds,
// choices). Typed access with Megatron's defaults. trainer/cli/config_builder.cpp turns these into the
// typed Config; nobody else reads flags.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "trainer/cli/flag_table.h"

namespace fp8tron {

class FlagValues {
 public:
  // Explicitly given values (command line, then --config for the names not on the command line).
  void set(const std::string& name, std::vector<std::string> values);
  void unset(const std::string& name);  // back to the table's default
  bool given(const std::string& name) const;
  const std::map<std::string, std::vector<std::string>>& all_given() const { return given_; }

  // Typed getters: the given value, else the table's default. An unset optional value is nullopt.
  std::optional<int64_t> opt_int(const std::string& name) const;
  std::optional<double> opt_float(const std::string& name) const;
  std::optional<std::string> opt_string(const std::string& name) const;
  int64_t get_int(const std::string& name) const;      // error if unset and no default
  double get_float(const std::string& name) const;     // error if unset and no default
  std::string get_string(const std::string& name) const;  // "" if unset
  bool get_bool(const std::string& name) const;
  std::vector<std::string> get_list(const std::string& name) const;

 private:
  std::optional<std::string> scalar(const std::string& name) const;
  std::map<std::string, std::vector<std::string>> given_;
};

// Parses argv (argv[0] is the program). Throws UserError for unknown flags (with a suggestion),
// missing or malformed values, values outside a flag's choices and bad --config files.
// `--help` and `--version` are reported through `help_requested` and `version_requested`.
struct ParsedCommandLine {
  FlagValues values;
  bool help_requested = false;
  bool version_requested = false;  // --version
};
ParsedCommandLine parse_command_line(int argc, const char* const* argv);

// Merges a JSON object (keys = flag names, '-' or '_') into values for names not already given.
void merge_json_config(const std::string& path, FlagValues& values);

std::string usage_text();

}  // namespace fp8tron
