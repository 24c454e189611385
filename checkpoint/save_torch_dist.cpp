#include "checkpoint/save_torch_dist.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/fault_points.h"
#include "checkpoint/megatron/dcp_writer.h"
#include "checkpoint/megatron/megatron_checkpoint.h"
#include "checkpoint/megatron/torch_save_writer.h"
#include "checkpoint/megatron_common_state.h"
#include "checkpoint/rank_agreement.h"
#include "checkpoint/rng_state.h"
#include "checkpoint/save.h"
#include "checkpoint/saved_tensors.h"
#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "fp8/fp8_engine.h"

namespace fp8tron {
namespace ck = checkpoint;
namespace mg = checkpoint::megatron;
namespace {

constexpr const char* kLayers = "decoder.layers.";
constexpr const char* kStackedExperts = "mlp.experts.experts.";

// A decoder layer's field under Megatron's name in that layer (the layer index dropped): a routed
// expert's weight mlp.experts.linear_fc<k>.weight<e> is Megatron's sequential experts'
// mlp.experts.experts.linear_fc<k>.weight at expert e (*expert = e, else -1); with local layers the
// pre-MLP norm of an MoE layer is saved under the fused name of the dense layers, as Megatron's
// local layer spec maps it. Its local multi-latent attention layers map no names: their modules'
// own (the latents' norms q_layernorm and kv_layernorm, the norm before a dense MLP
// pre_mlp_layernorm), where fp8tron's (and Transformer Engine's) fuse those norms into the next
// linear.
std::string megatron_layer_field(const std::string& rest, bool local, bool mla, int64_t* expert) {
  static const std::regex kExpert(R"(^mlp\.experts\.(linear_fc[12]\.(?:weight|bias))(\d+)$)");
  static const std::regex kPreMlpNorm(R"(^pre_mlp_layernorm\.(weight|bias)$)");
  static const std::regex kMlaFusedNorm(
      R"(^(self_attention\.linear_q_up_proj|self_attention\.linear_kv_up_proj|mlp\.linear_fc1)\.layer_norm_(weight|bias)$)");
  std::smatch m;
  *expert = -1;
  if (std::regex_match(rest, m, kExpert)) {
    *expert = std::stoll(m[2].str());
    return kStackedExperts + m[1].str();
  }
  if (local && mla) {
    if (!std::regex_match(rest, m, kMlaFusedNorm)) return rest;
    const std::string linear = m[1].str();
    const char* module = linear == "mlp.linear_fc1"                    ? "pre_mlp_layernorm."
                         : linear == "self_attention.linear_q_up_proj" ? "self_attention.q_layernorm."
                                                                        : "self_attention.kv_layernorm.";
    return module + m[2].str();
  }
  if (local && std::regex_match(rest, m, kPreMlpNorm)) return "mlp.linear_fc1.layer_norm_" + m[1].str();
  return rest;
}

// The decoder layer a parameter belongs to ("decoder.layers.3.mlp..." -> 3, "mlp..."), or -1.
int64_t layer_of(const std::string& name, std::string* rest) {
  if (name.rfind(kLayers, 0) != 0) return -1;
  const size_t dot = name.find('.', std::strlen(kLayers));
  FP8TRON_CHECK(dot != std::string::npos, "a decoder-layer parameter name without a field: " + name);
  *rest = name.substr(dot + 1);
  return std::stoll(name.substr(std::strlen(kLayers), dot - std::strlen(kLayers)));
}

// The model's sizes a chunk's Megatron name and global shape depend on. `numbered_layers`: each
// decoder layer's tensors and objects under the layer's own number instead of stacked.
struct StackedSizes {
  int64_t num_layers = 0, num_experts = 0;
  bool local = false, numbered_layers = false, mla = false;
};

// Megatron stacks the decoder layers' tensors only when its layers are alike: with
// --moe-layer-freq a list (even one of MoE layers only) or an integer above 1, it stores every
// layer under its own number (TransformerBlock.sharded_state_dict's non-homogeneous layers).
bool numbered_layers(const Config& c) {
  for (const auto& [flag, text] : c.resolved_flags) {
    if (flag != "moe-layer-freq") continue;
    if (text.find('[') != std::string::npos) return true;
    try {
      return std::stoll(text) > 1;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

StackedSizes stacked_sizes(const Config& c) {
  return StackedSizes{c.model.num_layers, c.model.moe.num_experts, !c.model.transformer_engine_modules,
                      numbered_layers(c), c.model.mla.enabled};
}

// One box of a parameter (or of an optimizer state laid out like it) as a DCP chunk under
// Megatron's name: decoder-layer tensors stacked along a first dimension of num_layers (or under
// their layer's number), routed experts' along a next one of num_experts. `data`: the box's
// elements, row-major.
mg::DcpChunkToWrite chunk_of(const std::string& prefix, const std::string& name, const std::vector<int64_t>& global,
                             const ck::Box& box, const torch::Tensor& data, const StackedSizes& sizes) {
  mg::DcpChunkToWrite c;
  std::vector<int64_t> shape = box.shape;
  std::string rest, mtp_head;
  const int64_t layer = layer_of(name, &rest);
  int64_t expert = -1;
  const std::string layer_prefix = sizes.numbered_layers ? kLayers + std::to_string(layer) + "." : kLayers;
  if (layer >= 0) c.fqn = prefix + layer_prefix + megatron_layer_field(rest, sizes.local, sizes.mla, &expert);
  else if (mg::split_mtp_transformer_layer(name, &mtp_head, &rest))
    c.fqn = prefix + mtp_head + megatron_layer_field(rest, sizes.local, sizes.mla, &expert);
  else c.fqn = prefix + name;
  c.global_shape = global;
  c.offsets = box.offset;
  if (expert >= 0) {
    c.global_shape.insert(c.global_shape.begin(), sizes.num_experts);
    c.offsets.insert(c.offsets.begin(), expert);
    shape.insert(shape.begin(), 1);
  }
  if (layer >= 0 && !sizes.numbered_layers) {
    c.global_shape.insert(c.global_shape.begin(), sizes.num_layers);
    c.offsets.insert(c.offsets.begin(), layer);
    shape.insert(shape.begin(), 1);
  }
  c.data = data.view(shape);
  return c;
}

// The chunks of the slot's elements [begin, end) (its local, row-major numbering), `flat` holding
// them: a piece's part as the boxes it covers (a distributed-optimizer shard may start and end
// inside a row).
void add_range_chunks(const std::string& prefix, const Slot& slot, int tp_rank, int tp, int64_t begin, int64_t end,
                      const torch::Tensor& flat, const StackedSizes& sizes, std::vector<mg::DcpChunkToWrite>& out) {
  for (const Piece& piece : param_pieces(slot, tp_rank, tp)) {
    const int64_t lo = std::max(begin, piece.begin), hi = std::min(end, piece.begin + piece.numel);
    if (lo >= hi) continue;
    int64_t at = lo - begin;
    for (const ck::Box& box : ck::flat_range_to_boxes(piece.box, lo - piece.begin, hi - piece.begin)) {
      const int64_t n = ck::box_volume(box);
      out.push_back(chunk_of(prefix, checkpoint_name(slot), slot.info.global_shape, box, flat.narrow(0, at, n), sizes));
      at += n;
    }
  }
}

// `t` on the host: a copy of a device tensor; a CPU tensor itself, or with `own` (an asynchronous
// save, written while training changes the buffers) a copy of it.
torch::Tensor host(const torch::Tensor& t, bool own) {
  if (!t.is_cpu()) return t.to(torch::kCPU);
  return own ? t.clone() : t;
}

// The FP8 recipe state (delayed scaling: scales and amax histories) of the linear layers whose
// amax group this rank leads, so fp8tron resumes its FP8 run exactly: each a tensor under a name
// of fp8tron's own, which Megatron, reading only the names its model asks for, passes over. Its
// Transformer Engine layers find None in their _extra_state and start their scaling afresh, as
// when Megatron loads a bf16 checkpoint into an FP8 run.
void add_fp8_state_chunks(const TrainingState& s, std::vector<mg::DcpChunkToWrite>& out) {
  if (!s.fp8) return;
  for (const auto& site : s.fp8->sites()) {
    if (!stores_fp8_state(s, *site, true)) continue;
    const torch::Tensor state = s.fp8->site_state(*site);
    if (!state.defined()) continue;
    out.push_back({kTorchDistFp8StatePrefix + site->name, state.sizes().vec(), std::vector<int64_t>(state.dim(), 0),
                   state.contiguous()});
  }
}

// This rank's chunks: its tensor-parallel boxes of the weights, written by the first
// data-parallel rank (each replica once), and of the optimizer state: Adam's moments (and the fp32
// main weights of bf16/fp16 runs), laid out like the weights. With the distributed optimizer every
// rank of the first optimizer instance writes its shard of them, and the main weights are stored
// in every precision, as Megatron's `fully_reshardable` layout has them.
std::vector<mg::DcpChunkToWrite> rank_chunks(const TrainingState& s, bool own) {
  std::vector<mg::DcpChunkToWrite> out;
  const ModelConfig& m = s.config.model;
  const StackedSizes sizes = stacked_sizes(s.config);
  for (const auto& domain : s.optimizer.domains()) {
    const OptimizerDomain& o = *domain;
    const bool weights_writer = o.groups().dp->rank() == 0 && s.parallel.cp_rank == 0;
    const bool states_writer = s.config.checkpoint.save_optim &&
                               (o.distributed() ? !o.groups().instances || o.groups().instances->rank() == 0 : weights_writer);
    const int tp = o.groups().tp->size(), tp_rank = o.groups().tp->rank();
    std::vector<std::pair<std::string, torch::Tensor>> states;  // laid out from shard_begin()
    if (states_writer) {
      if (o.distributed()) states.emplace_back(kDistributedMainParamPrefix, o.main_params_to_save());
      else if (o.model_params().scalar_type() != torch::kFloat32) states.emplace_back(kMainParamPrefix, o.main_params_to_save());
      for (const auto& state : optimizer_states_to_save(o, s.config.optimizer)) states.push_back(state);
    }
    const int64_t shard_begin = o.shard_begin(), shard_end = o.shard_begin() + o.shard_numel();
    for (const Slot& slot : o.param_slots()) {
      if (slot.info.shared_embedding_copy) continue;              // the embedding's, stored by the first stage
      if (slot.info.partition_dim < 0 && tp_rank != 0) continue;  // replicated over TP: rank 0 stores it
      if (weights_writer) {
        const torch::Tensor flat = host(o.model_params().detach().narrow(0, slot.offset, slot.numel), own);
        add_range_chunks("", slot, tp_rank, tp, 0, slot.numel, flat, sizes, out);
      }
      const int64_t lo = std::max(slot.offset, shard_begin), hi = std::min(slot.offset + slot.numel, shard_end);
      if (lo >= hi) continue;
      for (const auto& [prefix, buffer] : states) {
        const torch::Tensor flat = host(buffer.detach().narrow(0, lo - shard_begin, hi - lo), own);
        add_range_chunks(prefix, slot, tp_rank, tp, lo - slot.offset, hi - slot.offset, flat, sizes, out);
      }
    }
  }
  // Persistent model buffers (the MoE routers' fp32 expert_bias): Megatron's modules store them
  // as they store weights, stacked over the layers. The same on every rank of a stage.
  const ParallelState& p = s.parallel;
  if (p.tp_rank == 0 && p.dp_rank == 0 && p.cp_rank == 0)
    for (const auto& [name, buffer] : s.buffers) {
      const torch::Tensor t = host(buffer.detach().to(torch::kFloat32).contiguous(), own);
      out.push_back(chunk_of("", name, t.sizes().vec(), ck::whole(t.sizes().vec()), t.view({-1}), sizes));
    }
  add_fp8_state_chunks(s, out);
  return out;
}

// What a stage's decoder layers hold: MoE or not, a shared expert, the attention's linear layers
// (linear_qkv and linear_proj; multi-latent attention's projections), the routed experts on this
// rank.
struct LayerContents {
  bool moe = false, shared_expert = false;
  std::set<std::string> attention_linears;  // "self_attention.linear_proj", ...
  std::set<int64_t> experts;
};

// The modules of a decoder layer whose _extra_state Megatron stores: its attention's linear
// layers, and with Transformer Engine (Megatron's default --transformer-impl) its core attention;
// a dense MLP's linear layers, or an MoE layer's shared expert's (its routed experts' are per
// expert, below).
std::vector<std::string> extra_state_modules(bool local, const LayerContents& c) {
  std::vector<std::string> out(c.attention_linears.begin(), c.attention_linears.end());
  if (!local) out.insert(out.begin(), "self_attention.core_attention");
  if (!c.moe) out.insert(out.end(), {"mlp.linear_fc1", "mlp.linear_fc2"});
  if (c.shared_expert) out.insert(out.end(), {"mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"});
  return out;
}

// Megatron's ShardedObject name: key/shard_<offsets>_<shape> over the stacked dimensions, joined
// by "."; an object of none is shard_0_1.
std::string object_key(const std::string& key, const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape) {
  auto dotted = [](const std::vector<int64_t>& v, const char* none) {
    std::vector<std::string> parts;
    for (int64_t x : v) parts.push_back(std::to_string(x));
    return parts.empty() ? std::string(none) : join(parts, ".");
  };
  return key + "/shard_" + dotted(offsets, "0") + "_" + dotted(shape, "1");
}

void add_layer_field(const std::string& rest, LayerContents& c) {
  static const std::regex kAttentionLinear(R"(^(self_attention\.linear_[a-z_]+)\.(?:weight|bias)$)");
  int64_t expert = -1;
  megatron_layer_field(rest, false, false, &expert);
  if (expert >= 0) c.experts.insert(expert);
  std::smatch m;
  if (std::regex_match(rest, m, kAttentionLinear)) c.attention_linears.insert(m[1].str());
  if (rest.rfind("mlp.router.", 0) == 0) c.moe = true;
  if (rest.rfind("mlp.shared_experts.", 0) == 0) c.shared_expert = true;
}

// The stage's decoder layers, by number.
std::map<int64_t, LayerContents> stage_layers(const TrainingState& s) {
  std::map<int64_t, LayerContents> out;
  for (const auto& domain : s.optimizer.domains())
    for (const Slot& slot : domain->param_slots()) {
      std::string rest;
      const int64_t layer = layer_of(slot.name, &rest);
      if (layer >= 0) add_layer_field(rest, out[layer]);
    }
  return out;
}

// The multi-token-prediction layers this rank holds (Megatron's mtp.layers.<d>.*), by their
// "mtp.layers.<d>." prefix: what their transformer layer holds.
std::map<std::string, LayerContents> mtp_layers(const TrainingState& s) {
  static const std::regex kMtp(R"(^mtp\.layers\.\d+\.)");
  std::map<std::string, LayerContents> out;
  std::smatch m;
  for (const auto& domain : s.optimizer.domains())
    for (const Slot& slot : domain->param_slots()) {
      if (!std::regex_search(slot.name, m, kMtp)) continue;
      LayerContents& c = out[m[0].str()];
      std::string head, rest;
      if (mg::split_mtp_transformer_layer(slot.name, &head, &rest)) add_layer_field(rest, c);
    }
  return out;
}

// The _extra_state objects of one transformer layer whose stacked dimensions (the layers, unless
// numbered; none for a multi-token-prediction layer) are `at` of `of`: the first tensor- and
// data-parallel rank writes its modules', the first expert tensor- and data-parallel rank its
// routed experts'.
void add_layer_objects(const std::string& prefix, const LayerContents& contents, const std::vector<int64_t>& at,
                       const std::vector<int64_t>& of, const StackedSizes& sizes, bool layer_writer, bool expert_writer,
                       const std::string& none, std::vector<mg::DcpObjectToWrite>& out) {
  if (layer_writer)
    for (const std::string& module : extra_state_modules(sizes.local, contents))
      out.push_back({object_key(prefix + module + "._extra_state", at, of), none});
  if (!expert_writer) return;
  for (int64_t expert : contents.experts)
    for (const char* linear : {"linear_fc1", "linear_fc2"}) {
      std::vector<int64_t> expert_at = at, expert_of = of;
      expert_at.push_back(expert), expert_of.push_back(sizes.num_experts);
      out.push_back({object_key(prefix + kStackedExperts + linear + "._extra_state", expert_at, expert_of), none});
    }
}

// The objects this rank writes: the _extra_state of its stage's layers and multi-token-prediction
// layers (None, as without FP8) by the first tensor- and data-parallel rank, those of its routed
// experts by their first expert tensor- and data-parallel rank, and on rank 0 the common state.
std::vector<mg::DcpObjectToWrite> rank_objects(const TrainingState& s, int64_t iteration,
                                               const std::vector<MegatronParamGroup>& groups,
                                               const std::vector<std::vector<ck::RngState>>& rng) {
  std::vector<mg::DcpObjectToWrite> out;
  const ParallelState& p = s.parallel;
  if (p.world_rank == 0) out.push_back({"common_state/shard_0_1", megatron_common_state_bytes(s, iteration, groups, rng)});
  mg::TorchSaveWriter none_writer;
  const std::string none = none_writer.bytes(mg::py_list({mg::py_none()}));
  const StackedSizes sizes = stacked_sizes(s.config);
  const bool layer_writer = p.tp_rank == 0 && p.dp_rank == 0 && p.cp_rank == 0;
  const bool expert_writer = p.expert_tp_rank == 0 && p.expert_dp_rank == 0;
  for (const auto& [prefix, contents] : mtp_layers(s)) {
    if (layer_writer) out.push_back({object_key(prefix + "eh_proj._extra_state", {}, {}), none});
    add_layer_objects(prefix + "transformer_layer.", contents, {}, {}, sizes, layer_writer, expert_writer, none, out);
  }
  for (const auto& [layer, contents] : stage_layers(s)) {
    const std::string prefix = sizes.numbered_layers ? kLayers + std::to_string(layer) + "." : kLayers;
    std::vector<int64_t> at, of;  // the stacked dimensions: the layers, unless numbered
    if (!sizes.numbered_layers) at = {layer}, of = {sizes.num_layers};
    add_layer_objects(prefix, contents, at, of, sizes, layer_writer, expert_writer, none, out);
  }
  return out;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.flush();
  if (!out) throw UserError(path + ": writing failed; is the disk full?");
}

// Every rank's generator states, on every rank (a collective): fp8tron's own RNG states, which
// the common state carries for fp8tron's resumes (megatron_common_state.h).
std::vector<std::vector<ck::RngState>> gather_rng_states(const TrainingState& s) {
  std::vector<std::vector<ck::RngState>> out;
  const std::vector<std::string> packed = all_gather_strings(s.parallel, s.device, pack(generator_fields(s.device)));
  for (size_t rank = 0; rank < packed.size(); ++rank) {
    const std::vector<std::string> f = unpack(packed[rank]);
    out.emplace_back();
    for (size_t i = 0; i + 1 < f.size(); i += 2) out.back().push_back(ck::RngState{int(rank), f[i], f[i + 1]});
  }
  return out;
}

// Rank 0: the metadata files, then the commit.
void commit(const TrainingState& s, const ck::SaveTarget& target, const std::vector<std::string>& entries) {
  const std::string dir = ck::temp_dir_path(target);
  mg::write_dcp_metadata(dir, entries, ck::final_dir_path(target));
  write_bytes(dir + "/metadata.json", "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1}");
  ck::fault_point("save:metadata-written");
  ck::CommitOptions options;
  for (int r = 0; r < s.parallel.sizes.world_size; ++r)
    options.expected_files.push_back("__" + std::to_string(r) + "_0.distcp");
  options.expected_files.push_back(".metadata");
  options.expected_files.push_back("metadata.json");
  options.expected_files.push_back("common.pt");
  options.expected_file_count = int64_t(options.expected_files.size());
  options.hook = [](ck::CommitStep step) {
    std::string name = std::string("commit:") + ck::commit_step_name(step);
    std::replace(name.begin(), name.end(), ' ', '-');
    ck::fault_point(name);
  };
  ck::commit_save(target, options);
}

}  // namespace

std::unique_ptr<PendingTorchDistSave> prepare_torch_dist_save(const TrainingState& s, int64_t iteration,
                                                              bool non_persistent, bool own_copies) {
  const ParallelState& p = s.parallel;
  const CheckpointConfig& k = s.config.checkpoint;
  auto save = std::make_unique<PendingTorchDistSave>();
  save->start = std::chrono::steady_clock::now();
  save->non_persistent = non_persistent;
  save->for_rerun = s.rerun && s.rerun->to_save;
  const std::string dir = non_persistent ? ck::non_persistent_dir(k.non_persistent_dir, k.save) : k.save;
  log::print(strprintf("saving %scheckpoint at iteration %7lld to %s in torch_dist format", non_persistent ? "non-persistent " : "",
                       (long long)iteration, dir.c_str()));
  if (save->for_rerun)
    log::warning("the rerun engine's record of the faulty iteration is not stored in a torch_dist checkpoint "
                 "(Megatron's format has no place for fp8tron's); a run resumed from it does not re-run that "
                 "iteration: save in fp8tron's format (no --ckpt-format) to keep it");
  s.optimizer.finish_param_gather();
  save->target = ck::SaveTarget{dir, iteration, false, agree_on_token(p, s.device)};
  const auto rng = k.save_rng ? gather_rng_states(s) : std::vector<std::vector<ck::RngState>>{};
  const std::vector<MegatronParamGroup> groups = gather_megatron_param_groups(s);
  try {
    ck::begin_save(save->target);
    const auto copy_start = std::chrono::steady_clock::now();
    save->objects = rank_objects(s, iteration, groups, rng);
    if (p.world_rank == 0)
      save->common_pt = megatron_common_state_bytes(s, iteration, groups, rng, CommonStateFile::kCommonPt);
    save->chunks = rank_chunks(s, own_copies);
    save->copy_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - copy_start).count();
    for (const auto& c : save->chunks) save->bytes_copied += c.data.numel() * int64_t(c.data.element_size());
  } catch (const UserError& e) {
    save->error = e.what();
  } catch (const std::exception& e) {  // an internal error too: every rank must learn of it, or the others wait
    const std::string what = e.what();
    save->error = "saving in torch_dist format failed (an internal error, please report it): " + what.substr(0, what.find('\n'));
  }
  return save;
}

void write_torch_dist_file(PendingTorchDistSave& save, int rank) noexcept {
  if (!save.error.empty()) return;
  try {
    save.entries = mg::write_dcp_file(ck::temp_dir_path(save.target), rank, save.objects, save.chunks);
    if (!save.common_pt.empty()) write_bytes(ck::temp_dir_path(save.target) + "/common.pt", save.common_pt);
    ck::fault_point("save:shard-written");
  } catch (const UserError& e) {
    save.error = e.what();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    save.error = "saving in torch_dist format failed (an internal error, please report it): " + what.substr(0, what.find('\n'));
  }
  save.objects.clear();
  save.chunks.clear();  // the host copies go as soon as they are written
  save.common_pt.clear();
}

void finalize_torch_dist_save(const TrainingState& s, PendingTorchDistSave& save) {
  const ParallelState& p = s.parallel;
  save.objects.clear();
  save.chunks.clear();
  fail_save_together(p, s.device, save.target, save.error);
  const std::vector<std::string> all = all_gather_strings(p, s.device, save.entries);
  std::optional<ck::Tracker> previous;
  if (p.world_rank == 0) {
    try {
      previous = ck::read_tracker(save.target.save_dir);
    } catch (const UserError&) {
      // a garbage tracker is replaced by the commit; nothing to retain or delete
    }
    try {
      commit(s, save.target, all);
    } catch (const UserError& e) {
      save.error = e.what();
    }
  }
  fail_save_together(p, s.device, save.target, save.error);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - save.start).count();
  log::print(strprintf("  successfully saved checkpoint from iteration %7lld to %s [ t %d/%d, p %d/%d ]",
                       (long long)save.target.iteration, save.target.save_dir.c_str(), p.tp_rank + 1, p.sizes.tp,
                       p.pp_rank + 1, p.sizes.pp));
  log::info(strprintf("  checkpoint save took %.2f s", seconds));
  if (p.world_rank == 0)
    retire_after_commit(s.config.checkpoint, save.target, save.non_persistent, save.for_rerun, previous);
}

void save_torch_dist_checkpoint(const TrainingState& s, int64_t iteration, bool non_persistent) {
  std::unique_ptr<PendingTorchDistSave> save = prepare_torch_dist_save(s, iteration, non_persistent, false);
  write_torch_dist_file(*save, s.parallel.world_rank);
  finalize_torch_dist_save(s, *save);
}

}  // namespace fp8tron
