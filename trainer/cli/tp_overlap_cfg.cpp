#include "trainer/cli/tp_overlap_cfg.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fp8tron {
namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

[[noreturn]] void refuse(const UbCfgFile& f, int line, const std::string& why) {
  throw UserError("--tp-comm-overlap-cfg " + f.where(line) + ": " + why);
}

// A comment starts at a '#' that begins the line or follows whitespace, outside quotes (YAML).
std::string strip_comment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || std::isspace(static_cast<unsigned char>(line[i - 1])))) {
      return line.substr(0, i);
    }
  }
  return line;
}

// A plain or quoted scalar; anything that starts a YAML structure is outside the subset.
std::string scalar_value(const UbCfgFile& f, int line, const std::string& raw) {
  const std::string v = trim(raw);
  if (v.empty()) refuse(f, line, "a field needs a value (nested mappings are not part of a userbuffer config)");
  if (v.size() >= 2 && (v.front() == '\'' || v.front() == '"') && v.back() == v.front()) return v.substr(1, v.size() - 2);
  if (std::string("[{&*!|>%@`'\"").find(v.front()) != std::string::npos)
    refuse(f, line, "'" + v + "' is not a plain scalar; only `key: value` pairs of numbers, booleans and names are read");
  return v;
}

// Splits "key: rest" at the first ": " (or a trailing ':'); false when there is no such colon.
bool split_key(const std::string& text, std::string* key, std::string* rest) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ':') continue;
    if (i + 1 == text.size() || std::isspace(static_cast<unsigned char>(text[i + 1]))) {
      *key = trim(text.substr(0, i));
      *rest = text.substr(i + 1);
      return !key->empty();
    }
  }
  return false;
}

std::string json_scalar_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  return v.dump();  // anything else is refused by the typed reader with its text shown
}

UbCfgFile parse_json(const std::string& text, const std::string& path) {
  UbCfgFile f;
  f.path = path;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    refuse(f, 0, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) refuse(f, 0, "the file must hold an object of GEMM names");
  for (const auto& [name, fields] : j.items()) {
    if (!fields.is_object()) refuse(f, 0, "'" + name + "' must map to an object of fields");
    UbCfgEntry e{name, 0, {}};
    for (const auto& [key, value] : fields.items()) e.fields.push_back({key, json_scalar_text(value), 0});
    f.entries.push_back(std::move(e));
  }
  return f;
}

}  // namespace

bool parse_yaml_bool(const std::string& text, bool* out) {
  // PyYAML's resolver: each word in lower case, capitalised or upper case (not "y"/"n").
  const std::string t = trim(text);
  const std::string l = lower(t);
  std::string cap = l;
  if (!cap.empty()) cap[0] = char(std::toupper(static_cast<unsigned char>(cap[0])));
  std::string up = l;
  std::transform(up.begin(), up.end(), up.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  if (t != l && t != cap && t != up) return false;
  if (l == "true" || l == "yes" || l == "on") { *out = true; return true; }
  if (l == "false" || l == "no" || l == "off") { *out = false; return true; }
  return false;
}

bool parse_yaml_int(const std::string& text, long long* out) {
  const std::string t = trim(text);
  if (t.empty()) return false;
  size_t i = (t[0] == '-' || t[0] == '+') ? 1 : 0;
  if (i == t.size()) return false;
  for (size_t k = i; k < t.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(t[k])) && t[k] != '_') return false;  // YAML 1.1 allows 1_000
  std::string digits;
  for (char c : t)
    if (c != '_') digits += c;
  *out = std::strtoll(digits.c_str(), nullptr, 10);
  return true;
}

UbCfgFile parse_ub_cfg_yaml(const std::string& text, const std::string& path) {
  UbCfgFile f;
  f.path = path;
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  int field_indent = -1;
  while (std::getline(in, raw)) {
    ++line;
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    if (raw.find('\t') != std::string::npos) refuse(f, line, "tabs are not allowed in YAML indentation; use spaces");
    const std::string content = strip_comment(raw);
    if (trim(content).empty()) continue;
    if (line == 1 && trim(content) == "---") continue;
    size_t indent = 0;
    while (indent < content.size() && content[indent] == ' ') ++indent;
    std::string key, rest;
    if (!split_key(content.substr(indent), &key, &rest))
      refuse(f, line, "expected `name:` or `key: value`, got '" + trim(content) + "'");
    if (indent == 0) {
      if (!trim(rest).empty())
        refuse(f, line, "'" + key + "' must be a GEMM name followed by its indented fields (e.g. `qkv_fprop:` then `  method: ring_exchange`)");
      if (!f.entries.empty() && f.entries.back().fields.empty())
        refuse(f, f.entries.back().line, "'" + f.entries.back().gemm + "' has no fields");
      f.entries.push_back({key, line, {}});
      field_indent = -1;
      continue;
    }
    if (f.entries.empty()) refuse(f, line, "a field before any GEMM name");
    if (field_indent < 0) field_indent = int(indent);
    if (int(indent) != field_indent)
      refuse(f, line, "inconsistent indentation (nested mappings are not part of a userbuffer config)");
    for (const auto& existing : f.entries.back().fields)
      if (existing.key == key) refuse(f, line, "'" + key + "' given twice for " + f.entries.back().gemm);
    f.entries.back().fields.push_back({key, scalar_value(f, line, rest), line});
  }
  if (!f.entries.empty() && f.entries.back().fields.empty())
    refuse(f, f.entries.back().line, "'" + f.entries.back().gemm + "' has no fields");
  for (size_t i = 0; i < f.entries.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      if (f.entries[k].gemm == f.entries[i].gemm) refuse(f, f.entries[i].line, "'" + f.entries[i].gemm + "' given twice");
  return f;
}

UbCfgFile read_ub_cfg(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("--tp-comm-overlap-cfg " + path + ": cannot open the file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const bool json = path.size() >= 5 && lower(path.substr(path.size() - 5)) == ".json";
  return json ? parse_json(buffer.str(), path) : parse_ub_cfg_yaml(buffer.str(), path);
}

}  // namespace fp8tron
