// config.json of a Hugging Face model -> the fp8tron flags that build the same model (the ones
// the trainer needs), per model_type: gpt2, llama, qwen2, mixtral, qwen2_moe, deepseek_v3 (see
// hf_import.h for what each converts). Anything fp8tron's model would compute differently is
// refused in one line naming the config field.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fp8tron::hf {

// A JSON file (UserError naming the path when missing or malformed).
nlohmann::json read_json(const std::string& path);

// The shortest text that reads back the same value, for readable flags (1e-05, 0.02).
std::string number_text(double v);

// The model's flags, the format (the model_type) and notes (what differs slightly), from config.json.
struct ModelFlags {
  std::string format;
  std::vector<std::string> flags;
  std::vector<std::string> notes;
  void add(const std::string& flag) { flags.push_back(flag); }
  void add(const std::string& flag, const std::string& value) {
    flags.push_back(flag);
    flags.push_back(value);
  }
  void add(const std::string& flag, int64_t value) { add(flag, std::to_string(value)); }
  void add_number(const std::string& flag, double value) { add(flag, number_text(value)); }
};

ModelFlags model_flags(const std::string& hf_dir);

}  // namespace fp8tron::hf
