#include "checkpoint/megatron/distributed_optimizer_buffers.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace {

constexpr const char* kPrefix = "optimizer.distributed.";
constexpr int64_t kParamAlignment = 64;  // Megatron pads each parameter's start to 64 elements

struct Bucket {
  torch::Tensor param, exp_avg, exp_avg_sq;
};

// The flat buffers by bucket (the name up to its last '.').
std::map<std::string, Bucket> read_buckets(const DcpCheckpoint& dcp) {
  std::map<std::string, Bucket> buckets;
  for (const auto& [name, entry] : dcp.tensors()) {
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t dot = name.rfind('.');
    const std::string bucket = name.substr(0, dot), key = name.substr(dot + 1);
    if (entry.shape.size() != 1)
      throw UserError(dcp.source() + ": the distributed optimizer's " + name + " is not one flat buffer (saved by several "
                      "tensor- or pipeline-parallel ranks?); fp8tron reads that layout from data-parallel ranks only: "
                      "pass --no-load-optim to load the weights");
    Bucket& b = buckets[bucket];
    if (key == "param") b.param = dcp.tensor(name);
    else if (key == "exp_avg") b.exp_avg = dcp.tensor(name);
    else if (key == "exp_avg_sq") b.exp_avg_sq = dcp.tensor(name);
    else throw UserError(dcp.source() + ": the distributed optimizer's " + name + " is not Adam's; pass --no-load-optim");
  }
  for (const auto& [name, b] : buckets)
    if (!b.param.defined() || !b.exp_avg.defined() || !b.exp_avg_sq.defined())
      throw UserError(dcp.source() + ": the distributed optimizer's bucket " + name + " lacks param, exp_avg or "
                      "exp_avg_sq; pass --no-load-optim");
  return buckets;
}

int64_t layer_of(const std::string& name) {
  static const std::string kLayers = "decoder.layers.";
  if (name.rfind(kLayers, 0) != 0) return -1;
  return std::stoll(name.substr(kLayers.size()));
}

// Megatron's gradient buffer takes the parameters in reverse module order: among equal weights,
// the one it would place first (a later layer; in a layer, the MLP before the attention).
bool placed_before(const std::string& a, const std::string& b) {
  if (layer_of(a) != layer_of(b)) return layer_of(a) > layer_of(b);
  const bool a_mlp = a.find(".mlp.") != std::string::npos, b_mlp = b.find(".mlp.") != std::string::npos;
  if (a_mlp != b_mlp) return a_mlp;
  return a > b;
}

// Where each weight lies in the buckets' main weights, found by value.
struct Place {
  const Bucket* bucket;
  int64_t offset;
};

std::map<std::string, Place> locate(const std::map<std::string, Bucket>& buckets,
                                    const std::map<std::string, torch::Tensor>& weights, const std::string& where) {
  // The weights by their first value, as the buffer's fp32 values read in the weights' dtype.
  std::map<float, std::vector<std::string>> by_first;
  torch::ScalarType dtype = torch::kFloat32;
  for (const auto& [name, w] : weights) {
    dtype = w.scalar_type();
    by_first[w.flatten()[0].item<float>()].push_back(name);
  }
  std::map<std::string, Place> places;
  for (const auto& [bucket_name, bucket] : buckets) {
    const torch::Tensor values = bucket.param.to(dtype).to(torch::kFloat32).contiguous();
    const float* v = values.data_ptr<float>();
    const int64_t size = values.numel();
    int64_t pos = 0;
    while (pos < size) {
      std::vector<std::string> matches;
      auto it = by_first.find(v[pos]);
      if (it != by_first.end())
        for (const std::string& name : it->second) {
          const torch::Tensor w = weights.at(name).flatten().to(torch::kFloat32);
          if (places.count(name) || pos + w.numel() > size) continue;
          if (std::memcmp(w.data_ptr<float>(), v + pos, sizeof(float) * size_t(w.numel())) == 0) matches.push_back(name);
        }
      if (matches.empty()) {  // padding: the next parameter starts on the next aligned element
        pos = (pos / kParamAlignment + 1) * kParamAlignment;
        continue;
      }
      const std::string name = *std::min_element(matches.begin(), matches.end(), placed_before);
      places[name] = Place{&bucket, pos};
      pos += weights.at(name).numel();
    }
  }
  for (const auto& [name, w] : weights)
    if (!places.count(name))
      throw UserError(where + ": " + name + " is not in the distributed optimizer's buffers (another model's "
                      "optimizer state?); pass --no-load-optim to load the weights");
  return places;
}

// Adam's step from the `optimizer` objects' parameter groups (every group stepped alike).
void read_step(const DcpCheckpoint& dcp, MegatronCheckpoint& out) {
  for (const std::string& name : dcp.object_names()) {
    if (name.rfind(kPrefix, 0) != 0 || name.find(".optimizer/") == std::string::npos) continue;
    auto archive = dcp.object(name);
    PyRef root = archive->root();
    if (root && root->kind == PyValue::Kind::List && root->items.size() == 1) root = root->items[0];
    const PyRef groups = attribute(root, "param_groups");
    if (!groups || groups->kind != PyValue::Kind::List)
      throw UserError(archive->source() + ": holds no parameter groups; pass --no-load-optim");
    for (const PyRef& g : groups->items) {
      double step = 0;
      if (!as_double(attribute(g, "step"), step)) continue;
      if (out.step && *out.step != step)
        throw UserError(archive->source() + ": parameter groups stepped " + std::to_string(int64_t(*out.step)) +
                        " and " + std::to_string(int64_t(step)) + " times");
      out.step = step;
    }
  }
}

}  // namespace

bool is_distributed_optimizer_entry(const std::string& name) { return name.rfind(kPrefix, 0) == 0; }

void read_distributed_optimizer_buffers(const DcpCheckpoint& dcp, MegatronCheckpoint& out) {
  const std::map<std::string, Bucket> buckets = read_buckets(dcp);
  if (buckets.empty()) return;
  // Read stored tensor by stored tensor, so that each chunk of a stacked one is read once.
  std::vector<std::pair<std::string, std::string>> order;  // (source, name)
  for (const auto& [name, t] : out.tensors)
    if (!name.starts_with("optimizer.") && !is_model_buffer(name)) order.emplace_back(t.source(), name);
  std::sort(order.begin(), order.end());
  std::map<std::string, torch::Tensor> weights;
  for (const auto& [source, name] : order) weights[name] = out.tensors.at(name).read();
  dcp.forget_chunks();
  const std::map<std::string, Place> places = locate(buckets, weights, dcp.source());
  for (const auto& [name, place] : places) {
    const torch::Tensor& w = weights.at(name);
    auto segment = [&](const torch::Tensor& flat) { return flat.narrow(0, place.offset, w.numel()).view(w.sizes()).clone(); };
    out.tensors["optimizer.state.exp_avg." + name] = segment(place.bucket->exp_avg);
    out.tensors["optimizer.state.exp_avg_sq." + name] = segment(place.bucket->exp_avg_sq);
    if (w.scalar_type() != torch::kFloat32) out.tensors["optimizer.state.fp32_param." + name] = segment(place.bucket->param);
  }
  read_step(dcp, out);
}

}  // namespace fp8tron::checkpoint::megatron
