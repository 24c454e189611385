// Checkpoints written by Megatron-LM itself, read into fp8tron's terms.
//
// Formats (Megatron's --ckpt-format names), told apart by the files of iter_NNNNNNN/:
//   torch_dist  metadata.json {"sharded_backend": "torch_dist"} + a PyTorch distributed
//               checkpoint (.metadata, *.distcp; dcp_checkpoint.h): the weights of the decoder
//               layers stacked along a first dimension of num_layers, the optimizer's moments as
//               optimizer.state.exp_avg(_sq).<weight>, the rest (iteration, args, scheduler, Adam's
//               step) in the pickled "common_state" object
//   torch       mp_rank_00/model_optim_rng.pt, one torch.save file (torch_archive.h): the model's
//               state dict, torch.optim's state dict (moments by parameter index; in bf16/fp16
//               runs wrapped by Megatron's mixed-precision optimizer beside the fp32 main weights;
//               with MoE layers a list of two, the dense and the expert parameters' optimizers),
//               the scheduler, the iteration and the pickled argparse namespace
// Megatron's local layer names (input_layernorm, pre_mlp_layernorm) become the fused names that
// fp8tron's parameters have (linear_qkv.layer_norm_*, linear_fc1.layer_norm_*; in an MoE layer,
// one with a router, the norm before the MLP is pre_mlp_layernorm.*); the experts of an
// MoE layer (mlp.experts.experts.linear_fc<k>.weight stacked over layers and experts in
// torch_dist, mlp.experts.local_experts.<e>.linear_fc<k>.weight in torch) become fp8tron's
// mlp.experts.linear_fc<k>.weight<e>, e the global expert index. A torch_dist checkpoint of
// several ranks (tensor-, pipeline- or expert-parallel) is one set of global tensors whatever
// layout wrote it; its tensors are read when a rank asks for the boxes it holds (stored_tensor.h).
//
// The distributed optimizer's flat buffers (dp_reshardable, and the torch format's
// distrib_optim.pt) are read by distributed_optimizer_buffers.h.
//
// Legacy torch checkpoints of several tensor-, pipeline- or expert-parallel ranks are put together
// by legacy_model_parallel.h.
//
// Megatron's local multi-latent attention names its latents' norms q_layernorm and kv_layernorm;
// they become the up projections' fused norms (linear_q_up_proj.layer_norm_weight, ...).
//
// Not read: the RNG states (a resumed run's dropout streams restart).
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/megatron/stored_tensor.h"

namespace fp8tron::checkpoint::megatron {

struct BytesRead;  // torch_archive.h

// Megatron's name for the format of checkpoint directory `dir` ("torch_dist", "torch",
// "torch_dcp", "fsdp_dtensor", "zarr"), or "" when it is none of Megatron's.
std::string detect_format(const std::string& dir);

// Whether Megatron would load a checkpoint in `format` given --ckpt-format and
// --auto-detect-ckpt-format: "" when it would, else the one-line reason.
std::string format_refusal(const std::string& format, const std::string& ckpt_format, bool auto_detect,
                           const std::string& dir);

// Megatron's OptimizerParamScheduler state dict (steps count samples).
struct SchedulerValues {
  double max_lr = 0, min_lr = 0, start_wd = 0, end_wd = 0;
  int64_t lr_warmup_steps = 0, lr_decay_steps = 0, wd_incr_steps = 0, num_steps = 0;
  std::string lr_decay_style, wd_incr_style;
};

// Megatron's DynamicGradScaler state (fp16 runs).
struct LossScalerValues {
  double scale = 1;
  int64_t growth_tracker = 0, hysteresis_tracker = 0;
};

// fp8tron's own RNG states in a torch_dist checkpoint it wrote: Megatron's RNG states are other
// streams (the args say no_save_rng), so fp8tron stores every rank's generator states under a key
// of its own in the common state, which Megatron does not read, and restores them when the layout
// is the same: "fp8tron_rng_state": {"layout": (tp, pp, dp, cp, ep, vpp, world_size, etp),
// "ranks": [{"cpu": uint8 tensor, "cuda": uint8 tensor}, ...]}.
inline constexpr const char* kFp8tronRngStateKey = "fp8tron_rng_state";

struct MegatronCheckpoint {
  std::string format, path;  // path: the file or directory read, for messages
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0, consumed_valid_samples = 0;
  // Global tensors by fp8tron's checkpoint names: <param>, optimizer.state.exp_avg.<param> and
  // optimizer.state.exp_avg_sq.<param> (Adam's) or optimizer.state.momentum_buffer.<param> (SGD's)
  // when the checkpoint holds optimizer state,
  // and optimizer.state.fp32_param.<param> (the fp32 main weights of a bf16/fp16 run).
  std::map<std::string, StoredTensor> tensors;
  std::optional<LossScalerValues> loss_scaler;
  std::optional<double> step;  // Adam's step count
  // Whose state the optimizer.state.* tensors are: "adam" (exp_avg, exp_avg_sq), "sgd"
  // (momentum_buffer: torch.optim.SGD's momentum), or "" when the checkpoint holds none.
  std::string optimizer;
  std::optional<SchedulerValues> scheduler;
  // The saved run's arguments that fp8tron compares with its own (num_layers, hidden_size, ...).
  std::map<std::string, int64_t> model_args;
  // How its tensors are split over tensor-parallel ranks (legacy checkpoints of several ranks, the
  // distributed optimizer's buffers of each rank), and over how many ranks they were saved.
  bool gated_linear_unit = false, tied_embeddings = true;
  int64_t tensor_parallel = 1;
  // fp8tron's RNG states (kFp8tronRngStateKey) and the layout they were saved in; empty in a
  // checkpoint Megatron wrote.
  struct RngBytes {
    int rank = 0;
    std::string generator, state;  // "cpu" or "cuda", and its state's bytes
  };
  std::vector<RngBytes> fp8tron_rng;
  std::vector<int64_t> fp8tron_rng_layout;  // tp, pp, dp, cp, ep, vpp, world_size, etp
  // A torch_dist checkpoint's files, where its tensors are read from (null for a legacy one).
  std::shared_ptr<const DcpCheckpoint> dcp;
  // A legacy checkpoint of Megatron's distributed optimizer: its state lies in the ranks'
  // distrib_optim.pt files, read once the ranks' weights are put together.
  bool legacy_distributed_optimizer = false;
  // The bytes of those files' buffers read so far, and all they hold.
  std::shared_ptr<BytesRead> legacy_optimizer_reads;
  // A legacy checkpoint's tensors (model_optim_rng.pt: the weights, and the optimizer's state unless
  // the distributed optimizer's): the bytes read so far, and all they hold.
  std::shared_ptr<BytesRead> legacy_tensor_reads;
  // Why its optimizer state cannot be loaded (an optimizer or a layout fp8tron does not read),
  // or "": the weights still load with --no-load-optim or --finetune (the tables above then hold
  // no optimizer state).
  std::string optimizer_refusal;
};

// Whether `name` is a persistent model buffer (the MoE routers' expert_bias), which Megatron stores
// beside the weights but which is no parameter: it has no gradient and no optimizer state.
bool is_model_buffer(const std::string& name);

// A multi-token-prediction layer's transformer-layer name ("mtp.layers.0.transformer_layer.mlp..."
// -> head "mtp.layers.0.transformer_layer.", rest "mlp..."): Megatron names its fields as a decoder
// layer's but never stacks it with other layers.
bool split_mtp_transformer_layer(const std::string& name, std::string* head, std::string* rest);

// Reads the checkpoint in `dir` (an iter_NNNNNNN directory) in `format` ("torch_dist" or "torch"):
// of either its metadata and common state (a legacy one's pickles), the tensors being read when
// asked, each rank reading the boxes it holds. `weights_read` (fp8tron's names; null: all) are the
// weights whose optimizer state the caller reads: where the distributed optimizer's flat buffers
// hold it (torch_dist, or a legacy checkpoint's distrib_optim.pt), only their state is located
// (and an empty set locates none). Every problem is a UserError naming the file
// and what is wrong.
MegatronCheckpoint read_checkpoint(const std::string& dir, const std::string& format,
                                   const std::set<std::string>* weights_read = nullptr);

}  // namespace fp8tron::checkpoint::megatron
