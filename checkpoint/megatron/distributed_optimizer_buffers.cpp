#include "checkpoint/megatron/distributed_optimizer_buffers.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "checkpoint/megatron/damage.h"
#include "checkpoint/megatron/tensor_parallel_split.h"
#include "checkpoint/megatron/torch_archive.h"
#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace {

constexpr const char* kPrefix = "optimizer.distributed.";
constexpr int64_t kParamAlignment = 64;  // Megatron pads each parameter's start to 64 elements
constexpr size_t kHeadValues = 16;       // values of a weight compared before its hash
constexpr int64_t kLegacyPiece = 1 << 22;  // elements of a legacy buffer read at a time while searching

// One flat buffer of a bucket (its main weights or a moment): a stored tensor of a torch_dist
// checkpoint or a legacy file's tensor, either read in ranges when asked.
struct FlatBuffer {
  std::shared_ptr<const DcpCheckpoint> dcp;
  std::string name;                          // the stored tensor (torch_dist), or where it is (legacy)
  std::shared_ptr<const FlatRecord> record;  // the tensor in distrib_optim.pt (legacy)
  int64_t size = 0;

  torch::Tensor segment(int64_t offset, int64_t n) const {
    return record ? record->read(offset, n).to(torch::kFloat32) : dcp->region(name, {offset}, {n});
  }
};

struct Bucket {
  FlatBuffer param, exp_avg, exp_avg_sq;
  bool concatenated = false;  // a legacy buffer: several buckets, each without its end padding
};
// The flat buffers by model-parallel rank (a torch_dist name up to ".gbuf_idx_"), then by bucket.
using Groups = std::map<std::string, std::map<std::string, Bucket>>;

// The values of a bucket's main weights as the weights hold them (rounded to the weights' dtype,
// in fp32), read front to back one stored chunk at a time, so that no bucket is ever in memory
// whole: the chunks before the position searched are let go.
class RoundedValues {
 public:
  RoundedValues(const FlatBuffer& buffer, torch::ScalarType dtype) : buffer_(buffer), dtype_(dtype) {
    if (buffer.record) {
      for (int64_t begin = 0; begin < buffer.size; begin += kLegacyPiece)
        pieces_.push_back({begin, std::min(kLegacyPiece, buffer.size - begin), 0});
      return;
    }
    const DcpTensor& t = buffer.dcp->tensors().at(buffer.name);
    for (size_t i = 0; i < t.chunks.size(); ++i) pieces_.push_back({t.chunks[i].offsets[0], t.chunks[i].sizes[0], i});
    std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    int64_t end = 0;
    for (const Piece& p : pieces_) {
      if (p.begin != end) break;
      end += p.size;
    }
    if (end != buffer.size)
      throw DamagedCheckpoint(buffer.dcp->source() + ": the chunks of " + buffer.name + " do not cover the tensor once");
  }

  int64_t size() const { return buffer_.size; }
  float at(int64_t i) { return values_of(piece_of(i))[i - pieces_[piece_of(i)].begin]; }
  // Calls f(values, count) on the values [begin, end), piece by piece.
  template <class F>
  void visit(int64_t begin, int64_t end, F&& f) {
    while (begin < end) {
      const size_t k = piece_of(begin);
      const int64_t stop = std::min(end, pieces_[k].begin + pieces_[k].size);
      f(values_of(k) + (begin - pieces_[k].begin), stop - begin);
      begin = stop;
    }
  }
  // Lets go of the pieces wholly before `i`.
  void release_before(int64_t i) {
    std::erase_if(loaded_, [&](const auto& e) { return pieces_[e.first].begin + pieces_[e.first].size <= i; });
  }

 private:
  struct Piece {
    int64_t begin, size;
    size_t chunk;  // its index in the stored tensor's chunk list (torch_dist)
  };
  size_t piece_of(int64_t i) const {
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), i, [](int64_t v, const Piece& p) { return v < p.begin; });
    return size_t(it - pieces_.begin()) - 1;
  }
  const float* values_of(size_t k) {
    torch::Tensor& v = loaded_[k];
    if (!v.defined()) {
      const Piece& p = pieces_[k];
      const torch::Tensor raw =
          buffer_.record ? buffer_.record->read(p.begin, p.size) : buffer_.dcp->chunk(buffer_.name, p.chunk).flatten();
      v = raw.to(dtype_).to(torch::kFloat32).contiguous();
    }
    return v.data_ptr<float>();
  }

  const FlatBuffer& buffer_;
  torch::ScalarType dtype_;
  std::vector<Piece> pieces_;
  std::map<size_t, torch::Tensor> loaded_;
};

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// FNV-1a over the values' bit patterns: equal values (to the bit, as the buffers were written
// from the weights) give equal hashes whatever pieces they are read in.
constexpr uint64_t kHashStart = 0xcbf29ce484222325ULL;
uint64_t extend_hash(uint64_t h, const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h = (h ^ bits_of(v[i])) * 0x100000001b3ULL;
  return h;
}

Groups read_buckets(const std::shared_ptr<const DcpCheckpoint>& dcp) {
  Groups groups;
  for (const auto& [name, entry] : dcp->tensors()) {
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t dot = name.rfind('.');
    const std::string bucket = name.substr(0, dot), key = name.substr(dot + 1);
    if (entry.shape.size() != 1)
      throw UserError(dcp->source() + ": the distributed optimizer's " + name + " is not one flat buffer; fp8tron does "
                      "not know this layout: pass --no-load-optim to load the weights");
    const size_t gbuf = bucket.find(".gbuf_idx_");
    Bucket& b = groups[bucket.substr(0, gbuf)][bucket];
    FlatBuffer* buffer = key == "param" ? &b.param : key == "exp_avg" ? &b.exp_avg : key == "exp_avg_sq" ? &b.exp_avg_sq : nullptr;
    if (!buffer)
      throw UserError(dcp->source() + ": the distributed optimizer's " + name + " is not Adam's; pass --no-load-optim");
    *buffer = FlatBuffer{dcp, name, nullptr, entry.shape[0]};
  }
  for (const auto& [group, buckets] : groups)
    for (const auto& [name, b] : buckets) {
      if (b.param.name.empty() || b.exp_avg.name.empty() || b.exp_avg_sq.name.empty())
        throw UserError(dcp->source() + ": the distributed optimizer's bucket " + name + " lacks param, exp_avg or "
                        "exp_avg_sq; pass --no-load-optim");
      if (b.exp_avg.size != b.param.size || b.exp_avg_sq.size != b.param.size)
        throw DamagedCheckpoint(dcp->source() + ": the distributed optimizer's bucket " + name +
                                " holds param, exp_avg and exp_avg_sq of different sizes");
    }
  return groups;
}

// Where Megatron registers a parameter (fp8tron's names, or a legacy file's before the MoE and MLA
// norms are renamed): the model's parts in order (embedding, decoder layers, final norm,
// multi-token-prediction layers, output layer), the layer's index, and the module's place in its
// layer. Only the order of weights equal to one another matters (untrained norms in bf16), so the
// modules are ranked as far as that needs: the input norm first, the attention's projections, its
// query norm before its key (or key-value) norm, the norm before the MLP, the MLP's parts.
std::tuple<int, int64_t, int, std::string> registration_key(const std::string& name) {
  static const std::regex kLayer(R"(^(decoder|mtp)\.layers\.(\d+)\.(?:transformer_layer\.)?(.*)$)");
  static const std::pair<const char*, int> kModules[] = {
      {"input_layernorm.", 0},                              {"self_attention.linear_qkv.layer_norm_", 0},
      {"self_attention.linear_proj.", 1},                   {"self_attention.linear_qkv.", 2},
      {"self_attention.linear_q_proj.", 3},                 {"self_attention.linear_q_down_proj.", 3},
      {"self_attention.linear_q_up_proj.layer_norm_", 7},  {"self_attention.linear_q_up_proj.", 4},
      {"self_attention.linear_kv_down_proj.", 5},           {"self_attention.linear_kv_up_proj.layer_norm_", 8},
      {"self_attention.linear_kv_up_proj.", 6},             {"self_attention.q_layernorm.", 7},
      {"self_attention.k_layernorm.", 8},                   {"self_attention.kv_layernorm.", 8},
      {"pre_mlp_layernorm.", 9},                            {"mlp.linear_fc1.layer_norm_", 9},
      {"mlp.router.", 10},                                  {"mlp.experts.", 11},
      {"mlp.shared_experts.", 12},                          {"mlp.linear_fc1.", 13},
      {"mlp.linear_fc2.", 14},                              {"enorm.", -3},
      {"hnorm.", -2},                                       {"eh_proj.", -1}};
  std::smatch m;
  if (std::regex_match(name, m, kLayer)) {
    const std::string rest = m[3].str();
    int module = 15;
    for (const auto& [prefix, rank] : kModules)
      if (rest.starts_with(prefix)) {
        module = rank;
        break;
      }
    return {m[1].str() == "decoder" ? 1 : 3, std::stoll(m[2].str()), module, rest};
  }
  if (name.starts_with("embedding.")) return {0, 0, 0, name};
  if (name.starts_with("decoder.")) return {2, 0, 0, name};  // the final norm
  if (name.starts_with("output_layer.")) return {4, 0, 0, name};
  return {5, 0, 0, name};
}

// A weight, or one tensor-parallel rank's part of it, as the buffers hold it (its values in fp32
// after rounding to the weight's dtype: bf16/fp16 runs keep fp32 main weights that round to it),
// known by its length, its first values and a hash of all of them: the weights need not stay in
// memory while the buffers are searched.
struct Candidate {
  std::string name;
  int64_t part = -1;  // the tensor-parallel rank whose part it is; -1: the whole weight (the same on every rank)
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::vector<float> head;
  uint64_t hash = kHashStart;
  bool wanted = true;  // its state is read; otherwise it is searched for only to tell equal weights apart
};
using PartKey = std::pair<std::string, int64_t>;  // (weight, part)

Candidate candidate(const std::string& name, int64_t part, const torch::Tensor& values, bool wanted) {
  const torch::Tensor flat = values.flatten().to(torch::kFloat32).contiguous();
  Candidate c{name, part, values.sizes().vec(), flat.numel(), {}, kHashStart, wanted};
  const float* v = flat.data_ptr<float>();
  c.head.assign(v, v + std::min<int64_t>(c.numel, kHeadValues));
  c.hash = extend_hash(kHashStart, v, c.numel);
  return c;
}

// The weights already in out.tensors (not the optimizer's) whose state this rank reads, and every
// one-dimensional weight (norms and biases: untrained ones equal one another, and only the order
// of all of them tells which is which), read stored tensor by stored tensor so that each chunk of a
// stacked one is read once, one weight at a time.
std::vector<Candidate> candidates(const MegatronCheckpoint& out, const std::set<std::string>* weights_read,
                                  torch::ScalarType* dtype) {
  std::vector<std::pair<std::string, std::string>> order;  // (source, name)
  for (const auto& [name, t] : out.tensors)
    if (!name.starts_with("optimizer.") && !is_model_buffer(name) &&
        (!weights_read || weights_read->count(name) || t.shape().size() == 1))
      order.emplace_back(t.source(), name);
  std::sort(order.begin(), order.end());
  std::vector<Candidate> all;
  for (const auto& [source, name] : order) {
    const torch::Tensor w = out.tensors.at(name).read();
    *dtype = w.scalar_type();
    const bool wanted = !weights_read || weights_read->count(name);
    const TpSplit split = tp_split_of(name, out.gated_linear_unit);
    if (out.tensor_parallel == 1 || split == TpSplit::kReplicated) {
      all.push_back(candidate(name, -1, w, wanted));
      continue;
    }
    for (int64_t r = 0; r < out.tensor_parallel; ++r)
      all.push_back(candidate(name, r, tp_part(w, split, r, out.tensor_parallel, name), wanted));
  }
  return all;
}

// Where a candidate lies in a bucket's buffers.
struct Place {
  const Bucket* bucket;
  int64_t offset;
};

// Of the candidates `heads` (whose first values are those at `pos`), those whose every value is
// there: one pass over the longest of them, the hash compared at each one's length.
std::vector<size_t> whole_matches(RoundedValues& v, int64_t pos, std::vector<size_t> heads,
                                  const std::vector<Candidate>& all) {
  std::sort(heads.begin(), heads.end(), [&](size_t a, size_t b) { return all[a].numel < all[b].numel; });
  std::vector<size_t> matches;
  uint64_t h = kHashStart;
  int64_t hashed = pos;
  for (size_t i : heads) {
    v.visit(hashed, pos + all[i].numel, [&](const float* p, int64_t n) { h = extend_hash(h, p, n); });
    hashed = pos + all[i].numel;
    if (h == all[i].hash) matches.push_back(i);
  }
  return matches;
}

// The candidates found in one model-parallel rank's buckets (one dp_group_idx: a tensor- and
// pipeline-parallel rank's parameters), each at most once. Parameters start at multiples of
// kParamAlignment from their bucket's start: a position where no candidate starts is padding or a
// weight this rank does not search for, and the search goes on at the next multiple.
// The search ends once every wanted candidate has a place (`unplaced` counts those that have not).
void locate_in_group(const std::vector<const Bucket*>& buckets, const std::vector<Candidate>& all,
                     torch::ScalarType dtype, std::map<PartKey, Place>& places, int64_t& unplaced) {
  std::unordered_map<uint32_t, std::vector<size_t>> by_first;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].numel > 0) by_first[bits_of(all[i].head[0])].push_back(i);
  std::set<size_t> placed;
  for (const Bucket* bucket : buckets) {
    if (unplaced == 0) return;
    RoundedValues v(bucket->param, dtype);
    const int64_t size = v.size();
    // A legacy buffer concatenates its buckets without their end padding: a parameter found right
    // after the last one, off that grid, starts the next bucket.
    int64_t pos = 0, bucket_start = 0;
    while (pos < size) {
      std::vector<size_t> heads;
      auto it = by_first.find(bits_of(v.at(pos)));
      if (it != by_first.end())
        for (size_t i : it->second) {
          const Candidate& c = all[i];
          if (placed.count(i) || pos + c.numel > size) continue;
          size_t k = 1;
          while (k < c.head.size() && bits_of(v.at(pos + int64_t(k))) == bits_of(c.head[k])) ++k;
          if (k == c.head.size()) heads.push_back(i);
        }
      const std::vector<size_t> matches = heads.empty() ? heads : whole_matches(v, pos, heads, all);
      if (matches.empty()) {
        pos = bucket_start + ((pos - bucket_start) / kParamAlignment + 1) * kParamAlignment;
        v.release_before(pos);
        continue;
      }
      if (bucket->concatenated && (pos - bucket_start) % kParamAlignment != 0) bucket_start = pos;
      const size_t i = *std::min_element(matches.begin(), matches.end(), [&](size_t a, size_t b) {
        if (all[a].name != all[b].name) return placed_before_in_megatron_buffer(all[a].name, all[b].name);
        return all[a].part < all[b].part;
      });
      placed.insert(i);
      if (places.emplace(PartKey{all[i].name, all[i].part}, Place{bucket, pos}).second && all[i].wanted) --unplaced;
      if (unplaced == 0) return;  // a replica keeps its first place
      pos += all[i].numel;
      v.release_before(pos);
    }
  }
}

// Where each wanted weight (each tensor-parallel part of it) lies in the buckets' main weights,
// found by value, group by group.
std::map<PartKey, Place> locate(const Groups& groups, const std::vector<Candidate>& all, torch::ScalarType dtype,
                                const std::string& where) {
  std::map<PartKey, Place> places;
  int64_t unplaced = std::count_if(all.begin(), all.end(), [](const Candidate& c) { return c.wanted; });
  for (const auto& [group, buckets] : groups) {
    std::vector<const Bucket*> in_group;
    for (const auto& [name, b] : buckets) in_group.push_back(&b);
    locate_in_group(in_group, all, dtype, places, unplaced);
  }
  for (const Candidate& c : all)
    if (c.wanted && !places.count({c.name, c.part}))
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

// Where a weight's state lies: its tensor-parallel parts' segments of the buffers (one, for a
// weight the same on every rank), in rank order, and how Megatron split it.
struct StateSegments {
  struct Segment {
    const Bucket* bucket;
    int64_t offset, numel;
    std::vector<int64_t> shape;
  };
  std::vector<Segment> parts;
  TpSplit split = TpSplit::kReplicated;
  std::string name;

  // The box [offsets, offsets + sizes) of the state in `buffer`, read from the parts it overlaps
  // (a rank of the saved run's tensor-parallel size reads its own part only).
  torch::Tensor box(FlatBuffer Bucket::*buffer, const std::vector<int64_t>& offsets,
                    const std::vector<int64_t>& sizes) const {
    const int64_t dim = split == TpSplit::kColumns ? 0 : split == TpSplit::kRows ? 1 : -1;
    size_t first = 0, last = parts.size();
    if (dim >= 0) {
      const int64_t extent = parts.front().shape[size_t(dim)];
      first = size_t(offsets[size_t(dim)] / extent);
      last = size_t((offsets[size_t(dim)] + sizes[size_t(dim)] + extent - 1) / extent);
    }
    std::vector<torch::Tensor> read;
    for (size_t p = first; p < last; ++p)
      read.push_back((parts[p].bucket->*buffer).segment(parts[p].offset, parts[p].numel).view(parts[p].shape));
    torch::Tensor t = dim >= 0 ? torch::cat(read, dim) : join_tp_parts(read, split, name);
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int64_t start = offsets[d] - (int64_t(d) == dim ? int64_t(first) * parts.front().shape[d] : 0);
      t = t.narrow(int64_t(d), start, sizes[d]);
    }
    return t;
  }
};

// Each wanted weight's state as a stored tensor read when asked. Nothing of the state is read here.
void place_state(std::shared_ptr<const Groups> groups, const std::vector<Candidate>& all, torch::ScalarType dtype,
                 const std::string& where, MegatronCheckpoint& out) {
  const std::map<PartKey, Place> places = locate(*groups, all, dtype, where);
  std::map<std::string, StateSegments> states;
  for (const Candidate& c : all) {
    if (!c.wanted) continue;
    const Place& at = places.at({c.name, c.part});
    StateSegments& s = states[c.name];
    s.name = c.name;
    s.parts.push_back({at.bucket, at.offset, c.numel, c.shape});
  }
  for (auto& [name, segments] : states) {
    if (segments.parts.size() > 1) segments.split = tp_split_of(name, out.gated_linear_unit);
    auto shared = std::make_shared<const StateSegments>(std::move(segments));
    auto state = [&](FlatBuffer Bucket::*buffer) {
      return StoredTensor(out.tensors.at(name).shape(), torch::kFloat32, (shared->parts.front().bucket->*buffer).name,
                          [groups, shared, buffer](const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
                            return shared->box(buffer, offsets, sizes);
                          });
    };
    out.tensors["optimizer.state.exp_avg." + name] = state(&Bucket::exp_avg);
    out.tensors["optimizer.state.exp_avg_sq." + name] = state(&Bucket::exp_avg_sq);
    if (dtype != torch::kFloat32) out.tensors["optimizer.state.fp32_param." + name] = state(&Bucket::param);
  }
}

// The buffers of one legacy distrib_optim.pt into `groups`, one group per optimizer and gradient
// buffer (and dtype) of the file, each read in ranges when asked (`tally` counts the bytes).
void add_legacy_buffers(const std::string& path, Groups& groups, const std::shared_ptr<BytesRead>& tally) {
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
          auto record = archive.flat_record(t, where + " " + key, tally);
          b.*field = FlatBuffer{nullptr, where + " " + key, record, record->numel()};
        }
        if (b.exp_avg.size != b.param.size || b.exp_avg_sq.size != b.param.size)
          throw DamagedCheckpoint(where + ": param, exp_avg and exp_avg_sq of different sizes");
        groups[where][std::to_string(d)] = std::move(b);
      }
    }
  }
}

}  // namespace

bool is_distributed_optimizer_entry(const std::string& name) { return name.rfind(kPrefix, 0) == 0; }

bool placed_before_in_megatron_buffer(const std::string& a, const std::string& b) {
  return registration_key(a) > registration_key(b);
}

void read_distributed_optimizer_buffers(MegatronCheckpoint& out, const std::set<std::string>* weights_read) {
  FP8TRON_CHECK(out.dcp, "reading the distributed optimizer's buffers of a checkpoint that is not torch_dist");
  auto groups = std::make_shared<Groups>(read_buckets(out.dcp));
  if (groups->empty()) return;
  out.optimizer = "adam";
  read_step(*out.dcp, out);
  if (weights_read && weights_read->empty()) return;
  torch::ScalarType dtype = torch::kFloat32;
  const std::vector<Candidate> all = candidates(out, weights_read, &dtype);
  if (std::none_of(all.begin(), all.end(), [](const Candidate& c) { return c.wanted; })) return;
  place_state(std::move(groups), all, dtype, out.dcp->source(), out);
}

void read_legacy_distributed_optimizer(const std::vector<std::string>& files, MegatronCheckpoint& out,
                                       const std::set<std::string>* weights_read) {
  auto groups = std::make_shared<Groups>();
  out.legacy_optimizer_reads = std::make_shared<BytesRead>();
  for (const std::string& f : files) add_legacy_buffers(f, *groups, out.legacy_optimizer_reads);
  if (groups->empty()) return;
  out.optimizer = "adam";
  if (weights_read && weights_read->empty()) return;
  // The legacy weights still have the names Megatron's files give MoE and MLA norms (renamed after
  // this): the state of every one-dimensional weight is located, whatever its name becomes.
  std::set<std::string> wanted;
  if (weights_read) {
    wanted = *weights_read;
    for (const auto& [name, t] : out.tensors)
      if (t.shape().size() == 1) wanted.insert(name);
  }
  torch::ScalarType dtype = torch::kFloat32;
  const std::vector<Candidate> all = candidates(out, weights_read ? &wanted : nullptr, &dtype);
  if (std::none_of(all.begin(), all.end(), [](const Candidate& c) { return c.wanted; })) return;
  place_state(std::move(groups), all, dtype, files.front(), out);
}

}  // namespace fp8tron::checkpoint::megatron
