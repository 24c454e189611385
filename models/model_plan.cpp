#include "models/model_plan.h"

#include <optional>
#include <utility>

#include "models/gpt_model.h"
#include "models/linear/grouped_linear.h"
#include "models/linear/modules.h"

namespace fp8tron {
namespace {

std::optional<std::string> plan_of(const torch::nn::Module& m) {
  if (const auto* c = dynamic_cast<const TEColumnParallelLinearImpl*>(&m)) return c->plan().describe();
  if (const auto* n = dynamic_cast<const TELayerNormColumnParallelLinearImpl*>(&m)) return n->plan().describe();
  if (const auto* r = dynamic_cast<const TERowParallelLinearImpl*>(&m)) return r->plan().describe();
  if (const auto* g = dynamic_cast<const TEGroupedLinearImpl*>(&m)) return g->describe_plan();
  if (const auto* mlp = dynamic_cast<const MlpImpl*>(&m)) return "activation: " + mlp->describe_plan();
  return std::nullopt;
}

// "decoder.layers.7.mlp.linear_fc1" -> layer 7, "mlp.linear_fc1"; other names: no layer.
struct LayerName {
  std::optional<long long> layer;
  std::string rest;
};

LayerName split_layer(const std::string& name) {
  static const std::string prefix = "decoder.layers.";
  if (name.rfind(prefix, 0) != 0) return {std::nullopt, name};
  const size_t dot = name.find('.', prefix.size());
  const std::string index = name.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
  if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) return {std::nullopt, name};
  return {std::stoll(index), dot == std::string::npos ? std::string() : name.substr(dot + 1)};
}

using Lines = std::vector<std::pair<std::string, std::string>>;  // (name within the layer, plan)

void append_layers(std::string& out, long long first, long long last, const Lines& lines) {
  out += first == last ? "  layer " + std::to_string(first) + ":\n"
                       : "  layers " + std::to_string(first) + "-" + std::to_string(last) + ":\n";
  for (const auto& [name, plan] : lines) out += "    " + name + ": " + plan + "\n";
}

}  // namespace

std::vector<ModulePlan> model_plan(const torch::nn::Module& chunk) {
  std::vector<ModulePlan> out;
  for (const auto& item : chunk.named_modules("", /*include_self=*/false))
    if (auto plan = plan_of(*item.value())) out.push_back({item.key(), std::move(*plan)});
  return out;
}

std::string format_model_plan(const std::vector<ModulePlan>& plan) {
  std::string out;
  // The run of layers being gathered: [first, last] with one set of lines.
  std::optional<long long> first, last;
  Lines run, current;
  std::optional<long long> current_layer;
  auto close_layer = [&] {
    if (!current_layer) return;
    if (first && *last + 1 == *current_layer && current == run) {
      last = current_layer;
    } else {
      if (first) append_layers(out, *first, *last, run);
      first = last = current_layer;
      run = current;
    }
    current.clear();
    current_layer.reset();
  };
  auto flush_run = [&] {
    close_layer();
    if (first) append_layers(out, *first, *last, run);
    first.reset();
    last.reset();
    run.clear();
  };
  for (const auto& m : plan) {
    const LayerName n = split_layer(m.name);
    if (!n.layer) {
      flush_run();
      out += "  " + m.name + ": " + m.plan + "\n";
      continue;
    }
    if (current_layer != n.layer) close_layer();
    current_layer = n.layer;
    current.emplace_back(n.rest, m.plan);
  }
  flush_run();
  return out;
}

}  // namespace fp8tron
