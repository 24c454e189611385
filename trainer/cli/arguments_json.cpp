#include "trainer/cli/arguments_json.h"

#include <sstream>
#include <string>

#include "trainer/cli/flag_table.h"

namespace fp8tron {
namespace {

// Megatron's argument names: the flag without dashes ("hidden-size" -> "hidden_size").
std::string argument_name(std::string flag) {
  for (char& c : flag)
    if (c == '-') c = '_';
  return flag;
}

// One value as its flag's kind reads it; text that does not parse stays text.
nlohmann::json typed(FlagKind kind, const std::string& text) {
  try {
    size_t used = 0;
    if (kind == FlagKind::Int || kind == FlagKind::IntList) {
      const long long v = std::stoll(text, &used);
      if (used == text.size()) return v;
    } else if (kind == FlagKind::Float || kind == FlagKind::FloatList) {
      const double v = std::stod(text, &used);
      if (used == text.size()) return v;
    }
  } catch (const std::exception&) {
  }
  return text;
}

nlohmann::json value_json(const FlagSpec& spec, const std::string& text) {
  if (text == "None") return nullptr;  // config_builder's text for an unset value
  if (spec.kind == FlagKind::Bool) return text == "true";
  const bool list = spec.kind == FlagKind::IntList || spec.kind == FlagKind::FloatList || spec.kind == FlagKind::StringList;
  if (!list) return typed(spec.kind, text);
  nlohmann::json values = nlohmann::json::array();
  std::istringstream words(text);
  for (std::string word; words >> word;) values.push_back(typed(spec.kind, word));
  return values;
}

}  // namespace

nlohmann::json arguments_json(const Config& c) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [flag, text] : c.resolved_flags) {
    const FlagSpec* spec = find_flag(flag);
    out[argument_name(flag)] = spec ? value_json(*spec, text) : nlohmann::json(text);
  }
  out["world_size"] = c.parallel.world_size;
  out["data_parallel_size"] = c.parallel.dp;
  out["padded_vocab_size"] = c.model.padded_vocab_size;
  return out;
}

}  // namespace fp8tron
