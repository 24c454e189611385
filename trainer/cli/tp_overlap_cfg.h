// The file of --tp-comm-overlap-cfg: Transformer Engine's userbuffer configuration (`ub_cfgs`),
// a mapping from GEMM name ("qkv_fprop", ...) to a mapping of fields ("method: pipeline").
// Megatron reads it with yaml.safe_load; fp8tron has no YAML library, so it reads the subset
// such files use: `#` comments, `name:` at column 0, `key: scalar` indented under it, scalars
// being integers, YAML 1.1 booleans (true/yes/on, false/no/off; lower, Capital or UPPER case) or bare or quoted
// strings. Anything else (lists, flow mappings, anchors, tabs) is refused with file:line. A
// `.json` file holding the same two-level object is read as JSON. Torch-free.
#pragma once
#include <string>
#include <vector>

namespace fp8tron {

struct UbCfgField {
  std::string key, value;  // the value's text (quotes removed; JSON numbers/booleans as text)
  int line = 0;            // 1-based (0 for JSON)
};
struct UbCfgEntry {
  std::string gemm;  // as written
  int line = 0;
  std::vector<UbCfgField> fields;
};
struct UbCfgFile {
  std::string path;
  std::vector<UbCfgEntry> entries;
  std::string where(int line) const { return line > 0 ? path + ":" + std::to_string(line) : path; }
};

// Parses text (YAML subset); `path` only names the file in errors. UserError on anything outside
// the subset.
UbCfgFile parse_ub_cfg_yaml(const std::string& text, const std::string& path);
// Reads the file: JSON when it ends in ".json", else the YAML subset. UserError when it cannot
// be read or parsed.
UbCfgFile read_ub_cfg(const std::string& path);

// YAML 1.1 scalars as PyYAML's safe_load reads them: booleans and integers (0 and 1 are integers,
// which TE's fields treat as false and true). False when the text is not of that type.
bool parse_yaml_bool(const std::string& text, bool* out);
bool parse_yaml_int(const std::string& text, long long* out);

}  // namespace fp8tron
