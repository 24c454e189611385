#include "checkpoint/megatron/saved_arguments.h"

#include <charconv>

#include "checkpoint/megatron/dcp_checkpoint.h"
#include "checkpoint/megatron/legacy_model_parallel.h"
#include "checkpoint/megatron/megatron_checkpoint.h"
#include "checkpoint/megatron/torch_archive.h"
#include "core/error.h"

namespace fp8tron::checkpoint::megatron {
namespace {

// Python's repr of a float: the shortest text that reads back, with ".0" when integral.
std::string python_float(double v) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, v);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".eni") == std::string::npos) text += ".0";
  return text;
}

std::optional<std::string> as_text(const PyRef& v) {
  if (!v) return std::nullopt;
  switch (v->kind) {
    case PyValue::Kind::None: return std::string("None");
    case PyValue::Kind::Bool: return std::string(v->boolean ? "true" : "false");
    case PyValue::Kind::Int: return std::to_string(v->integer);
    case PyValue::Kind::Float: return python_float(v->real);
    case PyValue::Kind::Str: return v->text;
    default: return std::nullopt;
  }
}

std::map<std::string, std::string> namespace_text(const PyRef& args, const std::string& where) {
  if (!is_call_of(args, "argparse", "Namespace")) throw UserError(where + ": holds no argparse namespace 'args'");
  std::map<std::string, std::string> out;
  for (const auto& [name, value] : attributes(args))
    if (auto text = as_text(value)) out[name] = *text;
  return out;
}

}  // namespace

std::optional<std::map<std::string, std::string>> saved_arguments(const std::string& dir) {
  const std::string format = detect_format(dir);
  if (format == "torch_dist") {
    const DcpCheckpoint dcp(dir);
    const auto common = dcp.common_state();
    return namespace_text(attribute(DcpCheckpoint::common_state_dict(*common), "args"), common->source());
  }
  if (format == "torch") {
    const std::string path = first_legacy_rank_file(dir);
    const TorchArchive archive(path);
    return namespace_text(attribute(archive.root(), "args"), path);
  }
  if (!format.empty())
    throw UserError("checkpoint " + dir + " is in Megatron's " + format + " format; fp8tron reads the arguments of its "
                    "torch_dist and torch checkpoints");
  return std::nullopt;
}

}  // namespace fp8tron::checkpoint::megatron
