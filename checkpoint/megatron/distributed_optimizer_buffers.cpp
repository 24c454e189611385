#include "checkpoint/megatron/distributed_optimizer_buffers.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "checkpoint/megatron/tensor_parallel_split.h"
#include "checkpoint/megatron/torch_archive.h"
#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace {

constexpr const char* kPrefix = "optimizer.distributed.";
constexpr int64_t kParamAlignment = 64;  // Megatron pads each parameter's start to 64 elements

struct Bucket {
  torch::Tensor param, exp_avg, exp_avg_sq;
  bool concatenated = false;  // a legacy buffer: several buckets, each without its end padding
};

// The flat buffers by model-parallel rank (the name up to ".gbuf_idx_"), then by bucket (the name
// up to its last '.').
std::map<std::string, std::map<std::string, Bucket>> read_buckets(const DcpCheckpoint& dcp) {
  std::map<std::string, std::map<std::string, Bucket>> groups;
  for (const auto& [name, entry] : dcp.tensors()) {
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t dot = name.rfind('.');
    const std::string bucket = name.substr(0, dot), key = name.substr(dot + 1);
    if (entry.shape.size() != 1)
      throw UserError(dcp.source() + ": the distributed optimizer's " + name + " is not one flat buffer; fp8tron does "
                      "not know this layout: pass --no-load-optim to load the weights");
    const size_t gbuf = bucket.find(".gbuf_idx_");
    Bucket& b = groups[bucket.substr(0, gbuf)][bucket];
    if (key == "param") b.param = dcp.tensor(name);
    else if (key == "exp_avg") b.exp_avg = dcp.tensor(name);
    else if (key == "exp_avg_sq") b.exp_avg_sq = dcp.tensor(name);
    else throw UserError(dcp.source() + ": the distributed optimizer's " + name + " is not Adam's; pass --no-load-optim");
  }
  for (const auto& [group, buckets] : groups)
    for (const auto& [name, b] : buckets)
      if (!b.param.defined() || !b.exp_avg.defined() || !b.exp_avg_sq.defined())
        throw UserError(dcp.source() + ": the distributed optimizer's bucket " + name + " lacks param, exp_avg or "
                        "exp_avg_sq; pass --no-load-optim");
  return groups;
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

// A weight, or one tensor-parallel rank's part of it, as the buffers hold it: its values in fp32
// after rounding to the weight's dtype (bf16/fp16 runs keep fp32 main weights that round to it).
struct Candidate {
  std::string name;
  int64_t part = -1;  // the tensor-parallel rank whose part it is; -1: the whole weight (the same on every rank)
  torch::Tensor values;  // flat fp32
  std::vector<int64_t> shape;
};
using PartKey = std::pair<std::string, int64_t>;  // (weight, part)

// Where a candidate lies in a bucket's buffers.
struct Place {
  const Bucket* bucket;
  int64_t offset;
};

std::vector<Candidate> candidates(const std::map<std::string, torch::Tensor>& weights, int64_t tp, bool gated) {
  std::vector<Candidate> out;
  for (const auto& [name, w] : weights) {
    const TpSplit split = tp_split_of(name, gated);
    if (tp == 1 || split == TpSplit::kReplicated) {
      out.push_back({name, -1, w.flatten().to(torch::kFloat32).contiguous(), w.sizes().vec()});
      continue;
    }
    for (int64_t r = 0; r < tp; ++r) {
      const torch::Tensor part = tp_part(w, split, r, tp, name);
      out.push_back({name, r, part.flatten().to(torch::kFloat32).contiguous(), part.sizes().vec()});
    }
  }
  return out;
}

// The candidates found in one model-parallel rank's buckets (one dp_group_idx: a tensor- and
// pipeline-parallel rank's parameters), each at most once.
void locate_in_group(const std::vector<const Bucket*>& buckets, const std::vector<Candidate>& all,
                     torch::ScalarType dtype, std::map<PartKey, Place>& places) {
  std::map<float, std::vector<size_t>> by_first;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].values.numel() > 0) by_first[all[i].values.data_ptr<float>()[0]].push_back(i);
  std::set<size_t> placed;
  for (const Bucket* bucket : buckets) {
    const torch::Tensor values = bucket->param.to(dtype).to(torch::kFloat32).contiguous();
    const float* v = values.data_ptr<float>();
    const int64_t size = values.numel();
    // Parameters start at multiples of kParamAlignment from their bucket's start; a legacy buffer
    // concatenates its buckets without their end padding, so there a parameter found right after
    // the last one, off that grid, starts the next bucket.
    int64_t pos = 0, bucket_start = 0;
    while (pos < size) {
      std::vector<size_t> matches;
      auto it = by_first.find(v[pos]);
      if (it != by_first.end())
        for (size_t i : it->second) {
          const torch::Tensor& c = all[i].values;
          if (placed.count(i) || pos + c.numel() > size) continue;
          if (std::memcmp(c.data_ptr<float>(), v + pos, sizeof(float) * size_t(c.numel())) == 0) matches.push_back(i);
        }
      if (matches.empty()) {  // padding: the next parameter starts on the next aligned element
        pos = bucket_start + ((pos - bucket_start) / kParamAlignment + 1) * kParamAlignment;
        continue;
      }
      if (bucket->concatenated && (pos - bucket_start) % kParamAlignment != 0) bucket_start = pos;
      const size_t i = *std::min_element(matches.begin(), matches.end(), [&](size_t a, size_t b) {
        if (all[a].name != all[b].name) return placed_before(all[a].name, all[b].name);
        return all[a].part < all[b].part;
      });
      placed.insert(i);
      places.emplace(PartKey{all[i].name, all[i].part}, Place{bucket, pos});  // a replica's first place
      pos += all[i].values.numel();
    }
  }
}

// Where each weight (each tensor-parallel part of it) lies in the buckets' main weights, found by
// value, group by group.
std::map<PartKey, Place> locate(const std::map<std::string, std::map<std::string, Bucket>>& groups,
                                const std::vector<Candidate>& all, torch::ScalarType dtype, const std::string& where) {
  std::map<PartKey, Place> places;
  for (const auto& [group, buckets] : groups) {
    std::vector<const Bucket*> in_group;
    for (const auto& [name, b] : buckets) in_group.push_back(&b);
    locate_in_group(in_group, all, dtype, places);
  }
  for (const Candidate& c : all)
    if (!places.count({c.name, c.part}))
      throw UserError(where + ": " + c.name +
                      (c.part >= 0 ? " (its part on tensor-parallel rank " + std::to_string(c.part) + ")" : std::string()) +
                      " is not in the distributed optimizer's buffers (another model's optimizer state?); pass "
                      "--no-load-optim to load the weights");
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

// The weights already in out.tensors (not the optimizer's), read stored tensor by stored tensor so
// that each chunk of a stacked one is read once.
std::map<std::string, torch::Tensor> weights_of(const MegatronCheckpoint& out) {
  std::vector<std::pair<std::string, std::string>> order;  // (source, name)
  for (const auto& [name, t] : out.tensors)
    if (!name.starts_with("optimizer.") && !is_model_buffer(name)) order.emplace_back(t.source(), name);
  std::sort(order.begin(), order.end());
  std::map<std::string, torch::Tensor> weights;
  for (const auto& [source, name] : order) weights[name] = out.tensors.at(name).read();
  return weights;
}

// Each weight's state from the buffers of `groups`: its parts' segments, joined as Megatron split
// the weight.
void place_state(const std::map<std::string, std::map<std::string, Bucket>>& groups,
                 const std::map<std::string, torch::Tensor>& weights, const std::string& where,
                 MegatronCheckpoint& out) {
  const torch::ScalarType dtype = weights.begin()->second.scalar_type();
  const std::vector<Candidate> all = candidates(weights, out.tensor_parallel, out.gated_linear_unit);
  const std::map<PartKey, Place> places = locate(groups, all, dtype, where);
  std::map<std::string, std::vector<const Candidate*>> parts;
  for (const Candidate& c : all) parts[c.name].push_back(&c);
  for (const auto& [name, pieces] : parts) {
    auto state = [&, &pieces = pieces](torch::Tensor Bucket::*buffer) {
      std::vector<torch::Tensor> segments;
      for (const Candidate* c : pieces) {
        const Place& at = places.at({c->name, c->part});
        segments.push_back((at.bucket->*buffer).narrow(0, at.offset, c->values.numel()).view(c->shape));
      }
      const TpSplit split = pieces.front()->part < 0 ? TpSplit::kReplicated : tp_split_of(name, out.gated_linear_unit);
      return join_tp_parts(segments, split, name).clone();
    };
    out.tensors["optimizer.state.exp_avg." + name] = state(&Bucket::exp_avg);
    out.tensors["optimizer.state.exp_avg_sq." + name] = state(&Bucket::exp_avg_sq);
    if (dtype != torch::kFloat32) out.tensors["optimizer.state.fp32_param." + name] = state(&Bucket::param);
  }
}

// The buffers of one legacy distrib_optim.pt into `groups`, one group per optimizer and gradient
// buffer (and dtype) of the file.
void add_legacy_buffers(const std::string& path, std::map<std::string, std::map<std::string, Bucket>>& groups) {
  if (!std::filesystem::exists(path))
    throw UserError(path + " is missing: the distributed optimizer's state of its rank lies there; copy the whole "
                    "checkpoint, or pass --no-load-optim to load the weights only");
  const TorchArchive archive(path);
  const PyRef root = archive.root();
  std::vector<PyRef> optimizers;  // a chained optimizer's list (None where a rank saved nothing)
  if (root && root->kind == PyValue::Kind::List) optimizers = root->items;
  else optimizers.push_back(root);
  for (size_t k = 0; k < optimizers.size(); ++k) {
    const PyRef& state = optimizers[k];
    if (is_none(state)) continue;
    if (!state || state->kind != PyValue::Kind::Dict)
      throw UserError(path + ": not the distributed optimizer's parameter state (" + describe(state) + ")");
    const PyRef coalesced = attribute(state, "buckets_coalesced");
    if (!coalesced || coalesced->kind != PyValue::Kind::Bool || !coalesced->boolean)
      throw UserError(path + ": the distributed optimizer's state in Megatron's older per-bucket layout, which fp8tron "
                      "does not read; pass --no-load-optim to load the weights only");
    for (const auto& [gbuf, by_dtype] : state->entries) {
      if (gbuf->kind != PyValue::Kind::Int) continue;  // "buckets_coalesced"
      if (!by_dtype || by_dtype->kind != PyValue::Kind::Dict)
        throw UserError(path + ": gradient buffer " + describe(gbuf) + " holds no buffers by dtype");
      for (size_t d = 0; d < by_dtype->entries.size(); ++d) {
        const PyRef& buffers = by_dtype->entries[d].second;
        const std::string where = strprintf("%s, optimizer %zu, gradient buffer %lld", path.c_str(), k,
                                            (long long)gbuf->integer);
        Bucket b;
        b.concatenated = true;
        for (auto [key, field] : {std::pair{"param", &Bucket::param}, std::pair{"exp_avg", &Bucket::exp_avg},
                                  std::pair{"exp_avg_sq", &Bucket::exp_avg_sq}}) {
          const PyRef t = attribute(buffers, key);
          if (!t) throw UserError(where + " lacks " + key + " (not Adam's state?); pass --no-load-optim");
          b.*field = archive.tensor(t, where + " " + key).flatten().to(torch::kFloat32);
        }
        groups[where][std::to_string(d)] = std::move(b);
      }
    }
  }
}

}  // namespace

bool is_distributed_optimizer_entry(const std::string& name) { return name.rfind(kPrefix, 0) == 0; }

void read_distributed_optimizer_buffers(const DcpCheckpoint& dcp, MegatronCheckpoint& out) {
  const auto groups = read_buckets(dcp);
  if (groups.empty()) return;
  const std::map<std::string, torch::Tensor> weights = weights_of(out);
  dcp.forget_chunks();
  if (weights.empty()) return;
  place_state(groups, weights, dcp.source(), out);
  out.optimizer = "adam";
  read_step(dcp, out);
}

void read_legacy_distributed_optimizer(const std::vector<std::string>& files, MegatronCheckpoint& out) {
  std::map<std::string, std::map<std::string, Bucket>> groups;
  for (const std::string& f : files) add_legacy_buffers(f, groups);
  const std::map<std::string, torch::Tensor> weights = weights_of(out);
  if (groups.empty() || weights.empty()) return;
  place_state(groups, weights, files.front(), out);
  out.optimizer = "adam";
}

}  // namespace fp8tron::checkpoint::megatron
