#include "trainer/cli/flags.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

std::vector<std::string> split_choices(const char* choices) {
  std::vector<std::string> out;
  std::stringstream ss(choices);
  for (std::string item; std::getline(ss, item, '|');) out.push_back(item);
  return out;
}

bool parses_as_int(const std::string& s, int64_t* out = nullptr) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) {
    // Megatron accepts e.g. 1e6 for integers only through float parsing; we do not: be strict.
    return false;
  }
  if (out) *out = v;
  return true;
}

bool parses_as_float(const std::string& s, double* out = nullptr) {
  try {
    size_t pos = 0;
    double v = std::stod(s, &pos);
    if (pos != s.size()) return false;
    if (out) *out = v;
    return true;
  } catch (...) {
    return false;
  }
}

// Checks one value against its flag's kind and choices.
void check_value(const FlagSpec& spec, const std::string& value) {
  const std::string flag = std::string("--") + spec.name;
  switch (spec.kind) {
    case FlagKind::Int:
    case FlagKind::IntList:
      if (!parses_as_int(value)) throw UserError(flag + " expects an integer, got '" + value + "'");
      break;
    case FlagKind::Float:
    case FlagKind::FloatList: {
      double v = 0;
      if (!parses_as_float(value, &v)) throw UserError(flag + " expects a number, got '" + value + "'");
      if (!std::isfinite(v)) throw UserError(flag + " expects a finite number, got '" + value + "'");
      break;
    }
    case FlagKind::String:
      // An empty path would silently turn the feature off (e.g. --save ""): leave the flag out instead.
      if (value.empty()) throw UserError(flag + " was given an empty value; give a value or leave the flag out");
      break;
    default:
      break;
  }
  if (*spec.choices) {
    auto choices = split_choices(spec.choices);
    if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
      std::string hint = closest_match(value, choices);
      throw UserError(flag + ": invalid choice '" + value + "' (choose from " + join(choices, ", ") + ")" +
                      (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
    }
  }
}

bool is_list(FlagKind k) { return k == FlagKind::IntList || k == FlagKind::FloatList || k == FlagKind::StringList; }

[[noreturn]] void unknown_flag(const std::string& raw, const std::string& where) {
  std::string name = raw;
  while (!name.empty() && name[0] == '-') name.erase(0, 1);
  std::replace(name.begin(), name.end(), '_', '-');
  std::string hint = closest_match(name, all_flag_names());
  throw UserError("unknown flag " + where + "'" + raw + "'" +
                  (hint.empty() ? "" : "; did you mean '--" + hint + "'?"));
}

// Megatron's argparse refuses `--num-layers 2 3` and `--lr 1e-3 5e-4`; CLI11 with a take-last
// policy would keep the last word, so a single-valued flag followed by a second bare word is refused
// here, before CLI11 sees it.
void refuse_extra_values(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string token = argv[i];
    if (token.rfind("--", 0) != 0 || token.find('=') != std::string::npos) continue;
    const FlagSpec* spec = find_flag(token.substr(2));
    if (spec == nullptr || spec->kind == FlagKind::Bool || is_list(spec->kind)) continue;
    const int extra = i + 2;
    if (extra < argc && argv[extra][0] != '-')
      throw UserError(token + " takes one value, but '" + argv[i + 1] + "' is followed by '" + argv[extra] +
                      "'; remove the extra value");
    ++i;
  }
}

// CLI11 reads a value written "[a,b,c]" as the list a, b, c, so a single-valued flag would keep
// only "c": `--moe-layer-freq [1,0,1]` became 1. Such values of single-valued flags pass through
// CLI11 behind a marker that the parse then strips.
constexpr char kKeepWhole = '\x1f';

std::vector<std::string> protect_bracketed_values(int argc, const char* const* argv) {
  std::vector<std::string> args(argv, argv + argc);
  auto single_valued = [](const std::string& name) {
    const FlagSpec* spec = find_flag(name);
    return spec != nullptr && spec->kind != FlagKind::Bool && !is_list(spec->kind);
  };
  auto bracketed = [](const std::string& v) { return v.size() >= 2 && v.front() == '[' && v.back() == ']'; };
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& token = args[i];
    if (token.rfind("--", 0) != 0) continue;
    const size_t eq = token.find('=');
    if (eq != std::string::npos) {
      if (single_valued(token.substr(2, eq - 2)) && bracketed(token.substr(eq + 1))) token.insert(eq + 1, 1, kKeepWhole);
    } else if (i + 1 < args.size() && single_valued(token.substr(2)) && bracketed(args[i + 1])) {
      args[i + 1].insert(0, 1, kKeepWhole);
      ++i;
    }
  }
  return args;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
void FlagValues::set(const std::string& name, std::vector<std::string> values) { given_[name] = std::move(values); }
void FlagValues::unset(const std::string& name) { given_.erase(name); }
bool FlagValues::given(const std::string& name) const { return given_.count(name) != 0; }

std::optional<std::string> FlagValues::scalar(const std::string& name) const {
  const FlagSpec* spec = find_flag(name);
  FP8TRON_CHECK(spec != nullptr, "flag not in table: " + name);
  auto it = given_.find(name);
  if (it != given_.end() && !it->second.empty()) return it->second.front();
  if (*spec->default_value) return std::string(spec->default_value);
  return std::nullopt;
}

std::optional<int64_t> FlagValues::opt_int(const std::string& name) const {
  auto s = scalar(name);
  if (!s) return std::nullopt;
  int64_t v = 0;
  if (!parses_as_int(*s, &v)) throw UserError("--" + name + " expects an integer, got '" + *s + "'");
  return v;
}
std::optional<double> FlagValues::opt_float(const std::string& name) const {
  auto s = scalar(name);
  if (!s) return std::nullopt;
  double v = 0;
  if (!parses_as_float(*s, &v)) throw UserError("--" + name + " expects a number, got '" + *s + "'");
  return v;
}
std::optional<std::string> FlagValues::opt_string(const std::string& name) const { return scalar(name); }

int64_t FlagValues::get_int(const std::string& name) const {
  auto v = opt_int(name);
  if (!v) throw UserError("missing required flag --" + name);
  return *v;
}
double FlagValues::get_float(const std::string& name) const {
  auto v = opt_float(name);
  if (!v) throw UserError("missing required flag --" + name);
  return *v;
}
std::string FlagValues::get_string(const std::string& name) const { return scalar(name).value_or(""); }
bool FlagValues::get_bool(const std::string& name) const {
  auto it = given_.find(name);
  return it != given_.end() && !it->second.empty() && it->second.front() == "true";
}
std::vector<std::string> FlagValues::get_list(const std::string& name) const {
  auto it = given_.find(name);
  return it == given_.end() ? std::vector<std::string>{} : it->second;
}

// ------------------------------------------------------------------------------------------------
ParsedCommandLine parse_command_line(int argc, const char* const* argv) {
  ParsedCommandLine result;
  CLI::App app{"fp8tron: Megatron-style GPT trainer", "fp8tron"};
  app.set_help_flag();  // we print our own usage
  app.allow_extras();
  bool help = false, version = false;
  app.add_flag("-h,--help", help);
  app.add_flag("--version", version);

  // CLI11 parses; the flag table defines what exists. Storage per flag as raw strings.
  std::map<std::string, std::vector<std::string>> raw;
  std::map<std::string, CLI::Option*> options;
  for (const auto& spec : flag_table()) {
    const std::string flag = std::string("--") + spec.name;
    CLI::Option* opt = nullptr;
    if (spec.kind == FlagKind::Bool) {
      opt = app.add_flag(flag);
    } else {
      opt = app.add_option(flag, raw[spec.name]);
      if (is_list(spec.kind)) opt->expected(1, CLI::detail::expected_max_vector_size);
      else opt->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
    options[spec.name] = opt;
  }
  refuse_extra_values(argc, argv);
  const std::vector<std::string> args = protect_bracketed_values(argc, argv);
  std::vector<const char*> protected_argv;
  for (const auto& a : args) protected_argv.push_back(a.c_str());
  try {
    app.parse(int(protected_argv.size()), protected_argv.data());
  } catch (const CLI::ParseError& e) {
    throw UserError(std::string("command line: ") + e.what());
  }
  for (const auto& extra : app.remaining()) {
    if (extra.rfind("-", 0) == 0) unknown_flag(extra.substr(0, extra.find('=')), "");
    throw UserError("unexpected argument '" + extra + "' (values follow their flag, e.g. --num-layers 12)");
  }
  result.help_requested = help;
  result.version_requested = version;

  for (const auto& spec : flag_table()) {
    if (options[spec.name]->count() == 0) continue;
    std::vector<std::string> values =
        spec.kind == FlagKind::Bool ? std::vector<std::string>{"true"} : raw[spec.name];
    for (auto& v : values)
      if (!v.empty() && v.front() == kKeepWhole) v.erase(0, 1);
    for (const auto& v : values) check_value(spec, v);
    result.values.set(spec.name, std::move(values));
  }
  if (result.values.given("config")) merge_json_config(result.values.get_string("config"), result.values);
  return result;
}

void merge_json_config(const std::string& path, FlagValues& values) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError("--config " + path + ": is a directory; give the JSON file inside it");
  std::ifstream in(path);
  if (!in) throw UserError("--config " + path + ": cannot open the file");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError("--config " + path + ": not valid JSON (" + e.what() + ")");
  }
  if (!json.is_object()) throw UserError("--config " + path + ": the top level must be a JSON object of flag names");

  auto to_text = [&](const std::string& key, const nlohmann::json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    if (v.is_number()) { std::ostringstream os; os.precision(17); os << v.get<double>(); return os.str(); }
    throw UserError("--config " + path + ": key '" + key + "' has a value of unsupported type");
  };

  for (const auto& [raw_key, value] : json.items()) {
    // Megatron's YAML uses underscores; a few Megatron names really contain one.
    std::string key = raw_key;
    if (!find_flag(key)) std::replace(key.begin(), key.end(), '_', '-');
    const FlagSpec* spec = find_flag(key);
    if (!spec) unknown_flag(raw_key, "in --config " + path + ": ");
    if (key == "config") throw UserError("--config " + path + ": a config file cannot name another config file");
    if (values.given(key)) continue;  // the command line wins
    std::vector<std::string> items;
    if (spec->kind == FlagKind::Bool) {
      if (!value.is_boolean()) throw UserError("--config " + path + ": key '" + raw_key + "' must be true or false");
      if (!value.get<bool>()) continue;  // false = flag absent
      items = {"true"};
    } else if (value.is_array()) {
      if (!is_list(spec->kind)) throw UserError("--config " + path + ": key '" + raw_key + "' takes one value, not a list");
      for (const auto& item : value) items.push_back(to_text(raw_key, item));
    } else if (value.is_null()) {
      continue;  // None: keep the default
    } else {
      items = {to_text(raw_key, value)};
    }
    for (const auto& item : items) {
      try {
        check_value(*spec, item);
      } catch (const UserError& e) {
        throw UserError("--config " + path + ": " + e.what());
      }
    }
    values.set(key, std::move(items));
  }
}

std::string usage_text() {
  std::ostringstream os;
  os << "usage: fp8tron [--config FILE.json] [--flag value ...]\n"
        "Megatron-LM's flags with Megatron's names and defaults. Implemented flags:\n";
  for (const auto& f : flag_table()) {
    if (f.support != Support::Yes || is_test_flag(f)) continue;
    std::string left = std::string("  --") + f.name;
    if (f.kind != FlagKind::Bool) left += *f.choices ? " {" + std::string(f.choices) + "}" : " VALUE";
    os << left << (left.size() < 44 ? std::string(44 - left.size(), ' ') : "\n" + std::string(44, ' ')) << f.help;
    if (*f.default_value) os << " [default " << f.default_value << "]";
    os << "\n";
  }
  os << "Other Megatron flags are recognised: planned ones fail with 'not supported yet', hint-only ones\n"
        "are accepted with a warning, and math-changing ones we do not implement fail with an error.\n";
  return os.str();
}

}  // namespace fp8tron
