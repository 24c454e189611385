// The flags fp8tron implements or will implement (the feature named in the notes), with Megatron-LM's
// names and defaults, followed by every other Megatron-LM flag (flag_table_megatron.inc), so that
// unknown names can be told apart from Megatron flags we do not implement.
#include "trainer/cli/flag_table.h"

#include <unordered_map>

namespace fp8tron {
namespace {
using K = FlagKind;
using S = Support;
constexpr const char* kParallel = "a parallel-runtime option fp8tron does not implement yet";
constexpr const char* kFp8 = "FP8 option fp8tron does not implement yet";
constexpr const char* kData = "a data option fp8tron does not implement yet";
}  // namespace

const std::vector<FlagSpec>& flag_table() {
  static const std::vector<FlagSpec> table = {
      // ---- fp8tron's own -----------------------------------------------------------------------------
      {"config", K::String, "", S::Yes, "", "", "JSON file of flags (keys = flag names without '--'); command-line flags win."},
      {"dry-run", K::Bool, "", S::Yes, "", "", "Resolve and validate everything, print the plan and estimates, exit without touching data or GPUs."},
      {"print-model-plan", K::Bool, "", S::Yes, "", "", "Build the run as training would, print how every linear layer, MLP and expert group runs (precision, tensor-parallel communication and overlap, fused norm, bias, weight gradient), exit before the first step."},
      {"device", K::String, "", S::Yes, "", "cpu|cuda", "Where to train (default: cuda when a GPU is present, else cpu)."},
      {"builtin-data", K::Bool, "", S::Yes, "", "", "Train on fp8tron's embedded learnable synthetic dataset (first-order Markov text)."},
      {"log-all-ranks", K::Bool, "", S::Yes, "", "", "Print info lines from every rank, not only rank 0."},
      {"moe-dispatch-fp8", K::Bool, "", S::Yes, "", "", "fp8tron's own (not a Megatron flag): the alltoall token dispatcher sends each token quantized once in the FP8 experts' per-block recipe (--fp8-recipe blockwise or mxfp8), codes and scales, about half of bf16's bytes, which the experts' first grouped GEMM uses as they arrive; the combine and all gradients stay in the activations' dtype. Needs --moe-token-dispatcher-type alltoall and FP8 experts."},

      // ---- network size ------------------------------------------------------------------------------
      {"num-layers", K::Int, "", S::Yes, "", "", "Number of transformer layers."},
      {"hidden-size", K::Int, "", S::Yes, "", "", "Transformer hidden size."},
      {"ffn-hidden-size", K::Int, "", S::Yes, "", "", "MLP hidden size (default 4*hidden-size; with --swiglu 2/3 of that, rounded down to 64)."},
      {"num-attention-heads", K::Int, "", S::Yes, "", "", "Number of attention heads."},
      {"kv-channels", K::Int, "", S::Yes, "", "", "Projection size per head (default hidden-size / num-attention-heads)."},
      {"group-query-attention", K::Bool, "", S::Yes, "", "", "Use grouped-query attention."},
      {"num-query-groups", K::Int, "1", S::Yes, "", "", "Number of key/value groups with --group-query-attention."},
      {"seq-length", K::Int, "", S::Yes, "", "", "Maximum sequence length to process."},
      {"max-position-embeddings", K::Int, "", S::Yes, "", "", "Maximum number of position embeddings (default seq-length)."},
      {"position-embedding-type", K::String, "learned_absolute", S::Yes, "", "learned_absolute|rope|yarn|mrope|relative|none", "Position embedding: learned_absolute, rope, yarn (RoPE with YaRN frequency interpolation) or none. mrope and relative are refused."},
      {"rotary-base", K::Int, "10000", S::Yes, "", "", "Base of the rotary position embedding."},
      {"rotary-percent", K::Float, "1.0", S::Yes, "", "", "Fraction of each head's dimensions that get rotary embeddings."},
      {"normalization", K::String, "LayerNorm", S::Yes, "", "LayerNorm|RMSNorm", "Normalization layer."},
      {"norm-epsilon", K::Float, "1e-5", S::Yes, "", "", "Epsilon of the normalization layers."},
      {"apply-layernorm-1p", K::Bool, "", S::Yes, "", "", "LayerNorm weight stored as (gamma - 1): zero-centred gamma."},
      {"swiglu", K::Bool, "", S::Yes, "", "", "Use the gated SwiGLU MLP."},
      {"disable-bias-linear", K::Bool, "", S::Yes, "", "", "No biases in the linear layers."},
      {"add-qkv-bias", K::Bool, "", S::Yes, "", "", "Keep the QKV bias even with --disable-bias-linear."},
      {"untie-embeddings-and-output-weights", K::Bool, "", S::Yes, "", "", "Separate output-layer weights from the input embedding."},
      {"init-method-std", K::Float, "0.02", S::Yes, "", "", "Standard deviation of the normal weight initialisation."},
      {"attention-dropout", K::Float, "0.1", S::Yes, "", "", "Dropout on attention probabilities."},
      {"hidden-dropout", K::Float, "0.1", S::Yes, "", "", "Dropout on the hidden states (after attention and MLP, and on embeddings)."},
      {"vocab-size", K::Int, "", S::Yes, "", "", "Vocabulary size: NullTokenizer ids (eod = the last), TikTokenizer vocabulary (default 131072), --mock-data without --tokenizer-type, or --builtin-data (its text ids plus one end-of-document id)."},
      {"make-vocab-size-divisible-by", K::Int, "128", S::Yes, "", "", "Pad the vocabulary to a multiple of this (times tensor-parallel size)."},
      {"qk-layernorm", K::Bool, "", S::Yes, "", "", "Normalise queries and keys per head before attention."},
      {"attention-softmax-in-fp32", K::Bool, "", S::Yes, "", "", "Compute the attention softmax in fp32 (fused attention always accumulates it in fp32)."},
      {"transformer-impl", K::String, "transformer_engine", S::Yes, "", "transformer_engine|local", "Module implementation: Transformer-Engine-compatible modules or plain local ones."},

      // ---- training ----------------------------------------------------------------------------------
      {"micro-batch-size", K::Int, "", S::Yes, "", "", "Batch size per model instance (local batch size)."},
      {"global-batch-size", K::Int, "", S::Yes, "", "", "Training batch size across all data-parallel ranks (default micro-batch-size * data-parallel size)."},
      {"rampup-batch-size", K::StringList, "", S::Yes, "", "", "Batch-size ramp-up: <start batch size> <increment> <ramp-up samples>: the global batch grows from start by increment over the ramp-up samples, then stays at --global-batch-size (Megatron's classic semantics; sample-based training only). The newest Megatron-LM deprecates this flag and ignores it."},
      {"train-iters", K::Int, "", S::Yes, "", "", "Total number of iterations to train."},
      {"train-samples", K::Int, "", S::Yes, "", "", "Total number of samples to train (alternative to --train-iters)."},
      {"exit-interval", K::Int, "", S::Yes, "", "", "Exit when the iteration is divisible by this value."},
      {"exit-duration-in-mins", K::Int, "", S::Yes, "", "", "Exit after this many minutes."},
      {"seed", K::Int, "1234", S::Yes, "", "", "Random seed."},
      {"optimizer", K::String, "adam", S::Yes, "", "adam|sgd|muon|dist_muon|lion|soap|adaptive_muon", "Optimizer: adam (AdamW: decoupled weight decay), sgd, or muon (Newton-Schulz-orthogonalised momentum for 2-D hidden weights, Adam for the rest; dist_muon = muon with --use-distributed-optimizer). lion, soap and adaptive_muon are refused."},
      {"lr", K::Float, "", S::Yes, "", "", "Peak learning rate."},
      {"min-lr", K::Float, "0.0", S::Yes, "", "", "Minimum learning rate."},
      {"lr-decay-style", K::String, "linear", S::Yes, "", "constant|linear|cosine|inverse-square-root|WSD", "Learning-rate decay function."},
      {"lr-decay-iters", K::Int, "", S::Yes, "", "", "Iterations to decay the learning rate over (default --train-iters)."},
      {"lr-decay-samples", K::Int, "", S::Yes, "", "", "Samples to decay the learning rate over (default --train-samples)."},
      {"lr-warmup-fraction", K::Float, "", S::Yes, "", "", "Fraction of the decay span used for warmup."},
      {"lr-warmup-iters", K::Int, "0", S::Yes, "", "", "Iterations of linear warmup."},
      {"lr-warmup-samples", K::Int, "0", S::Yes, "", "", "Samples of linear warmup."},
      {"lr-warmup-init", K::Float, "0.0", S::Yes, "", "", "Learning rate at the start of warmup."},
      {"lr-wsd-decay-style", K::String, "exponential", S::Yes, "", "exponential|linear|cosine|minus_sqrt", "Annealing function of the WSD schedule."},
      {"lr-wsd-decay-iters", K::Int, "", S::Yes, "", "", "Iterations of the WSD annealing phase."},
      {"lr-wsd-decay-samples", K::Int, "", S::Yes, "", "", "Samples of the WSD annealing phase."},
      {"weight-decay", K::Float, "0.01", S::Yes, "", "", "Weight decay (not applied to biases and norm weights)."},
      {"start-weight-decay", K::Float, "", S::Yes, "", "", "Initial weight decay with --weight-decay-incr-style."},
      {"end-weight-decay", K::Float, "", S::Yes, "", "", "Final weight decay with --weight-decay-incr-style."},
      {"weight-decay-incr-style", K::String, "constant", S::Yes, "", "constant|linear|cosine", "Weight-decay increment function."},
      {"clip-grad", K::Float, "1.0", S::Yes, "", "", "Gradient clipping by global L2 norm (0 disables)."},
      {"adam-beta1", K::Float, "0.9", S::Yes, "", "", "Adam beta1."},
      {"adam-beta2", K::Float, "0.999", S::Yes, "", "", "Adam beta2."},
      {"adam-eps", K::Float, "1e-08", S::Yes, "", "", "Adam epsilon."},
      {"sgd-momentum", K::Float, "0.9", S::Yes, "", "", "SGD momentum."},
      {"check-for-nan-in-loss-and-grad", K::Bool, "", S::Yes, "", "", "Reject a NaN or inf loss or gradient norm: the run stops (with --rerun-mode validate_results after re-running the iteration to attribute it), naming the first parameter whose gradient is not finite (on by default, as in Megatron, which has only the --no- form; off with fp16's dynamic loss scale)."},

      // ---- mixed precision ---------------------------------------------------------------------------
      {"bf16", K::Bool, "", S::Yes, "", "", "bf16 parameters and compute, fp32 main weights and gradient accumulation."},
      {"fp16", K::Bool, "", S::Yes, "", "", "fp16 parameters and compute with dynamic loss scaling, fp32 main weights."},
      {"loss-scale", K::Float, "", S::Yes, "", "", "Static loss scale (positive power of 2); unset means dynamic scaling with --fp16."},
      {"initial-loss-scale", K::Float, "4294967296", S::Yes, "", "", "Initial dynamic loss scale."},
      {"min-loss-scale", K::Float, "1.0", S::Yes, "", "", "Minimum dynamic loss scale."},
      {"loss-scale-window", K::Float, "1000", S::Yes, "", "", "Iterations without overflow before the loss scale doubles."},
      {"hysteresis", K::Int, "2", S::Yes, "", "", "Overflows tolerated before the loss scale halves."},
      {"no-gradient-accumulation-fusion", K::Bool, "", S::Yes, "", "",
       "Do not fuse gradient accumulation into the weight-gradient GEMM (dW is written in the weight's dtype and added to the fp32 main gradient separately)."},
      {"accumulate-allreduce-grads-in-fp32", K::Bool, "", S::Yes, "", "", "Accumulate and all-reduce gradients in fp32 (always on with --bf16)."},

      // ---- validation and logging --------------------------------------------------------------------
      {"eval-interval", K::Int, "1000", S::Yes, "", "", "Iterations between validation runs."},
      {"eval-iters", K::Int, "100", S::Yes, "", "", "Iterations per validation run."},
      {"eval-global-batch-size", K::Int, "", S::Yes, "", "",
       "Sequences per validation iteration (default: --global-batch-size after any ramp-up); a multiple of "
       "--eval-micro-batch-size x data-parallel size."},
      {"log-interval", K::Int, "100", S::Yes, "", "", "Iterations between log lines."},
      {"log-throughput", K::Bool, "", S::Yes, "", "", "Log TFLOP/s per GPU."},
      {"log-params-norm", K::Bool, "", S::Yes, "", "", "Log the L2 norm of the parameters."},
      {"timing-log-level", K::Int, "0", S::Yes, "", "0|1|2", "Timers to log: 0 none, 1 per-iteration phases, 2 finer ones."},
      {"timing-log-option", K::String, "minmax", S::Yes, "", "max|minmax|all", "How timers across ranks are reported."},
      {"tensorboard-dir", K::String, "", S::Yes, "", "", "Write TensorBoard scalars here."},
      {"tensorboard-log-interval", K::Int, "1", S::Yes, "", "", "Iterations between TensorBoard points."},
      {"log-timers-to-tensorboard", K::Bool, "", S::Yes, "", "", "Write timers to TensorBoard."},
      {"log-validation-ppl-to-tensorboard", K::Bool, "", S::Yes, "", "", "Write validation perplexity to TensorBoard."},
      {"log-memory-to-tensorboard", K::Bool, "", S::Yes, "", "", "Enable memory logging to tensorboard."},
      {"log-world-size-to-tensorboard", K::Bool, "", S::Yes, "", "", "Enable world size logging to tensorboard."},
      {"log-fp8-stats-to-tensorboard", K::Bool, "", S::Yes, "", "", "fp8tron: every --tensorboard-log-interval iterations, write each FP8 linear's per-tensor amax and underflow/overflow counts (fp8/<layer>/<tensor>/...)."},
      {"no-log-loss-scale-to-tensorboard", K::Bool, "", S::Yes, "", "", "Disable loss-scale logging to tensorboard."},
      {"disable-log-loss-scale-to-tensorboard", K::Bool, "", S::Yes, "", "", "Disable loss-scale logging to tensorboard."},
      {"start-eval-at-iter", K::Int, "", S::Yes, "", "", "Start evaluation only after this iteration."},
      {"profile", K::Bool, "", S::Yes, "", "", "Profile iterations [--profile-step-start, --profile-step-end) on --profile-ranks: an Nsight Systems capture range (cudaProfilerStart/Stop; run under nsys --capture-range=cudaProfilerApi), or with --use-pytorch-profiler the PyTorch (Kineto) profiler."},
      {"profile-step-start", K::Int, "10", S::Yes, "", "", "Iteration (counted from 0) at which profiling starts."},
      {"profile-step-end", K::Int, "12", S::Yes, "", "", "Iteration (counted from 0) at which profiling stops."},
      {"profile-ranks", K::IntList, "0", S::Yes, "", "", "Global ranks to profile."},
      {"use-pytorch-profiler", K::Bool, "", S::Yes, "", "", "With --profile: the PyTorch (Kineto) profiler; its Chrome trace is written to --tensorboard-dir as <host>_<pid>.<time>.pt.trace.json."},
      {"pytorch-profiler-collect-shapes", K::Bool, "", S::Yes, "", "", "Record operator input shapes in the PyTorch profiler's trace."},
      {"mock-data", K::Bool, "", S::Yes, "", "", "Train on Megatron's mock dataset (counting sequences ending in EOD)."},

      // ---- parallel layout and data parallelism ------------------------------------------------
      {"tensor-model-parallel-size", K::Int, "1", S::Yes, "", "", "Degree of tensor model parallelism."},
      {"pipeline-model-parallel-size", K::Int, "1", S::Yes, "", "", "Degree of pipeline model parallelism."},
      {"context-parallel-size", K::Int, "1", S::Yes, "", "", "Degree of context parallelism: each sequence split over this many ranks (load-balanced: 2 x CP chunks, rank r holds chunks r and 2 CP - 1 - r)."},
      {"cp-comm-type", K::StringList, "p2p", S::Yes, "", "", "Context-parallel attention: p2p (ring), a2a (Ulysses all-to-all), all_gather (alias allgather) or a2a+p2p (hierarchical); one for all layers or one per layer."},
      {"hierarchical-context-parallel-sizes", K::IntList, "", S::Yes, "", "", "Levels of hierarchical context parallelism for a2a+p2p: the all-to-all level (consecutive ranks), then the ring level; their product is --context-parallel-size."},
      {"expert-model-parallel-size", K::Int, "1", S::Yes, "", "", "Degree of expert model parallelism (the experts of each MoE layer are spread over this many ranks)."},
      {"expert-tensor-parallel-size", K::Int, "", S::Yes, "", "", "Tensor parallelism of expert layers (default tensor-model-parallel-size)."},
      {"sequence-parallel", K::Bool, "", S::Yes, "", "", "Sequence parallelism over the tensor-parallel group."},
      {"use-tp-pp-dp-mapping", K::Bool, "", S::Yes, "", "", "Rank order tp-pp-dp instead of tp-cp-ep-dp-pp."},
      {"num-layers-per-virtual-pipeline-stage", K::Int, "", S::Yes, "", "", "Layers per virtual pipeline stage (interleaved schedule)."},
      {"num-virtual-stages-per-pipeline-rank", K::Int, "", S::Yes, "", "", "Virtual pipeline stages per pipeline rank."},
      {"decoder-first-pipeline-num-layers", K::Int, "", S::Yes, "", "", "Layers on the first pipeline stage."},
      {"decoder-last-pipeline-num-layers", K::Int, "", S::Yes, "", "", "Layers on the last pipeline stage."},
      {"overlap-grad-reduce", K::Bool, "", S::Yes, "", "", "Overlap the data-parallel gradient reduction with backward."},
      {"overlap-param-gather", K::Bool, "", S::Yes, "", "", "Overlap the distributed optimizer's parameter all-gather with the next forward pass (needs --use-distributed-optimizer and --overlap-grad-reduce)."},
      {"use-distributed-optimizer", K::Bool, "", S::Yes, "", "", "Shard optimizer state over data-parallel ranks."},
      {"num-distributed-optimizer-instances", K::Int, "1", S::Yes, "", "", "Copies of the distributed optimizer across the data-parallel (x context-parallel) ranks: each block of dp/N consecutive ranks shards one copy of the optimizer state, gradients are reduce-scattered within the block and all-reduced across blocks (needs --use-distributed-optimizer; dp x cp and the expert data-parallel size divisible by N)."},
      {"distributed-backend", K::String, "nccl", S::Yes, "", "nccl|gloo", "Collective backend: NCCL on GPUs (fp8tron uses MPI for CPU runs; gloo is refused)."},
      {"distributed-timeout-minutes", K::Int, "10", S::Yes, "", "", "Timeout of collective operations."},
      {"ddp-bucket-size", K::Int, "", S::Yes, "", "", "Gradient bucket size (elements)."},
      {"hang-report-seconds", K::Int, "90", S::Yes, "", "", "fp8tron: report a collective that has not completed after this many seconds, naming the group, the operation, the ranks that did not arrive and every rank's last finished iteration (--distributed-timeout-minutes still ends the job)."},

      // ---- activation recomputation ----------------------------------------------------------
      {"recompute-activations", K::Bool, "", S::Yes, "", "", "Recompute activations to save memory (sets --recompute-granularity selective)."},
      {"recompute-granularity", K::String, "", S::Yes, "", "full|selective", "Activation recomputation: full (whole layers, by --recompute-method) or selective (the --recompute-modules of every layer)."},
      {"recompute-method", K::String, "", S::Yes, "", "uniform|block", "Full recomputation: uniform (units of --recompute-num-layers consecutive layers) or block (the first --recompute-num-layers layers of each pipeline chunk)."},
      {"recompute-num-layers", K::Int, "", S::Yes, "", "", "Layers per recompute unit (uniform) or recomputed layers per pipeline chunk (block)."},
      {"distribute-saved-activations", K::Bool, "", S::Yes, "", "", "Split each recompute unit's saved input over the tensor-parallel ranks (full recomputation without sequence parallelism)."},
      {"recompute-modules", K::StringList, "", S::Yes, "", "", "Submodules recomputed with --recompute-granularity selective: core_attn (the default), mlp, layernorm (dense layers: fused into the linears, nothing to recompute); moe (the whole MoE layer: router, token dispatch, experts, combine), shared_experts (the MoE layers' shared expert), moe_act (the experts' activation), layernorm (MoE layers' pre-MLP norm, MLA's input norm), mla_up_proj (MLA's up projections); the last three discard their outputs and recompute them before their consumer's backward."},
      {"moe-layer-recompute", K::Bool, "", S::Yes, "", "", "Deprecated in Megatron: the same as --recompute-granularity selective with moe added to --recompute-modules."},

      // ---- mixture of experts (models/moe/, docs/moe.md) ---------------------------------------------
      {"num-experts", K::Int, "", S::Yes, "", "", "Number of experts per MoE layer (unset or 0: a dense model)."},
      {"moe-ffn-hidden-size", K::Int, "", S::Yes, "", "", "FFN hidden size of each routed expert (default --ffn-hidden-size)."},
      {"moe-layer-freq", K::String, "1", S::Yes, "", "", "MoE layers: an int N (every N-th layer, from layer 0) or a list pattern such as \"([0]*1+[1]*3)*2\" (1 = MoE layer)."},
      {"moe-router-topk", K::Int, "2", S::Yes, "", "", "Number of experts each token is routed to."},
      {"moe-router-score-function", K::String, "softmax", S::Yes, "", "softmax|sigmoid|sqrtsoftplus", "Router score function."},
      {"moe-router-pre-softmax", K::Bool, "", S::Yes, "", "", "Softmax over all experts before the top-k (default: softmax over the k selected logits)."},
      {"moe-router-topk-scaling-factor", K::Float, "", S::Yes, "", "", "Multiply the routing probabilities by this factor."},
      {"moe-router-dtype", K::String, "", S::Yes, "", "fp32|fp64", "Dtype of the gating GEMM output and of all routing math (default: the activations' dtype)."},
      {"moe-router-load-balancing-type", K::StringList, "aux_loss", S::Yes, "", "aux_loss|seq_aux_loss|global_aux_loss|sinkhorn|quantile_balancing|none", "Load-balancing strategy; several aux-loss types may be combined (each with its --moe-aux-loss-coeff). quantile_balancing is not implemented."},
      {"moe-aux-loss-coeff", K::FloatList, "0.0", S::Yes, "", "", "Coefficient(s) of the auxiliary load-balancing loss(es), one per --moe-router-load-balancing-type."},
      {"moe-z-loss-coeff", K::Float, "", S::Yes, "", "", "Coefficient of the router z-loss (e.g. 1e-3)."},
      {"moe-input-jitter-eps", K::Float, "", S::Yes, "", "", "Multiply the router input by Uniform(1-eps, 1+eps) noise."},
      {"moe-router-enable-expert-bias", K::Bool, "", S::Yes, "", "", "Aux-loss-free load balancing: a per-expert bias on the selection scores, updated after each step (sigmoid/sqrtsoftplus scores)."},
      {"moe-router-bias-update-rate", K::Float, "0.001", S::Yes, "", "", "Step of the expert-bias update."},
      {"moe-router-num-groups", K::Int, "", S::Yes, "", "", "Expert groups for group-limited routing (e.g. the expert-parallel size)."},
      {"moe-router-group-topk", K::Int, "", S::Yes, "", "", "Groups selected per token in group-limited routing."},
      {"moe-shared-expert-intermediate-size", K::Int, "", S::Yes, "", "", "Total FFN hidden size of the shared expert(s), which see every token."},
      {"moe-shared-expert-gate", K::Bool, "", S::Yes, "", "", "Sigmoid gate on the shared expert's output."},
      {"moe-shared-expert-overlap", K::Bool, "", S::Yes, "", "", "Overlap the shared expert with the token dispatch (alltoall dispatcher)."},
      {"moe-expert-capacity-factor", K::Float, "", S::Yes, "", "", "Capacity factor per expert (unset or negative: dropless)."},
      {"moe-pad-expert-input-to-capacity", K::Bool, "", S::Yes, "", "", "Pad each expert's input to the capacity (needs --moe-expert-capacity-factor)."},
      {"moe-token-drop-policy", K::String, "probs", S::Yes, "", "probs|position", "Tokens dropped over capacity: the lowest-probability ones or the latest positions."},
      {"moe-router-padding-for-quantization", K::Bool, "", S::Yes, "", "", "Pad each expert's routed tokens to a multiple of 16 (32 for MXFP8) in the routing map for FP8 GEMMs (alltoall dispatcher)."},
      {"moe-router-padding-for-fp8", K::Bool, "", S::Yes, "", "", "Deprecated alias of --moe-router-padding-for-quantization."},
      {"moe-permute-fusion", K::Bool, "", S::Yes, "", "", "Fused token permutation (fp8tron's permute/unpermute are always fused gather/scatter kernels; same math)."},
      {"moe-router-fusion", K::Bool, "", S::Yes, "", "", "Fused top-k routing and aux-loss computation (fp8tron's router math is the same either way)."},
      {"moe-grouped-gemm", K::Bool, "", S::Yes, "", "", "Run the local experts as grouped GEMMs (TEGroupedLinear; fp8tron always does)."},
      {"moe-per-layer-logging", K::Bool, "", S::Yes, "", "", "Also write the MoE losses of every layer to TensorBoard (moe/<name>_layer_<i>)."},
      {"moe-token-dispatcher-type", K::String, "allgather", S::Yes, "", "allgather|alltoall|flex", "Token dispatcher: allgather or alltoall (flex, DeepEP/HybridEP, is not implemented)."},
      // ---- FP8 -------------------------------------------------------------------------------
      {"fp8-format", K::String, "", S::Yes, "", "e4m3|hybrid|hif8", "FP8 format (turns FP8 on): e4m3, hybrid (E4M3 forward, E5M2 gradients) or hif8 (emulated)."},
      {"fp8-recipe", K::String, "delayed", S::Yes, "", "delayed|tensorwise|blockwise|mxfp8", "FP8 scaling recipe (mxfp8 is emulated on Hopper)."},
      {"fp8-transposes", K::String, "keep", S::Yes, "", "keep|recast", "fp8tron's own (not a Megatron flag): where the backward GEMMs' transposed FP8 copies come from. keep: cast in the forward pass and kept until backward, the weights' for the whole step (Transformer Engine's way, the fewest casts). recast: cast again in backward from what a bf16 run keeps anyway (each weight; fc2's input from fc1's output; QKV's and fc1's from the norm's input), the same codes, so FP8 holds less memory for a few more casts (docs/fp8.md, Memory)."},
      {"no-fp8-wgrad", K::Bool, "", S::Yes, "", "", "Compute weight gradients in higher precision instead of FP8 (Transformer Engine's override_linear_precision.wgrad): the wgrad GEMMs run in bf16 from the unquantized input and output gradient, which the linear keeps (or rebuilds) instead of their transposed FP8 copies; forward and dgrad stay FP8 (not yet for the MoE experts' FP8 grouped GEMMs or the tensor-parallel overlap)."},
      {"disable-fp8-wgrad", K::Bool, "", S::Yes, "", "", "Same as --no-fp8-wgrad."},
      {"fp8-dot-product-attention", K::Bool, "", S::Yes, "", "", "Run the core attention in FP8 too (Transformer Engine's fp8_dpa): Q, K, V, the probabilities and the output in E4M3, dO, dP and dQ/dK/dV in the recipe's gradient format, through cuDNN's fused FP8 attention on Hopper (emulated on CPU). Q, K, V and dO take current scales, dP/dQ/dK/dV delayed ones (docs/fp8.md, FP8 attention). Causal attention without dropout (--attention-dropout 0), document masks or context parallelism; --fp8-format e4m3 or hybrid; on Hopper a head dimension of 128 (the only one cuDNN's FP8 backward takes there)."},
      {"fp8-multi-head-attention", K::Bool, "", S::NotYet, "FP8 between the QKV projection, the attention and the output projection (--fp8-multi-head-attention); --fp8-dot-product-attention alone casts inside the attention", "", "Keep the attention's inputs and output in FP8 between the QKV and output projections (Transformer Engine's fp8_mha)."},
      {"fp8-margin", K::Int, "0", S::Yes, "", "", "Delayed scaling: scale margin (powers of two)."},
      {"fp8-interval", K::Int, "1", S::Yes, "", "", "Delayed scaling: steps between scale updates."},
      {"fp8-amax-history-len", K::Int, "1", S::Yes, "", "", "Delayed scaling: length of the amax history."},
      {"fp8-amax-compute-algo", K::String, "most_recent", S::Yes, "", "most_recent|max", "Delayed scaling: scale from the most recent amax or the history's max."},
      {"tp-only-amax-red", K::Bool, "", S::Yes, "", "", "Reduce FP8 amaxes over the tensor-parallel group only (default: tensor x data parallel)."},
      {"fp8-min-features", K::Int, "0", S::Yes, "", "", "fp8tron: linear layers with fewer input or output features per tensor-parallel rank stay bf16 (small GEMMs lose with FP8)."},
      {"no-use-gmm-fp8", K::Bool, "", S::Yes, "", "", "Run grouped expert GEMMs (TEGroupedLinear, MoE experts) in bf16 instead of FP8; no effect in a dense model."},
      {"first-last-layers-bf16", K::Bool, "", S::Yes, "", "", "Keep the first and last transformer layers' linears in bf16."},
      {"num-layers-at-start-in-bf16", K::Int, "1", S::Yes, "", "", "Layers at the start kept in bf16 (with --first-last-layers-bf16)."},
      {"num-layers-at-end-in-bf16", K::Int, "1", S::Yes, "", "", "Layers at the end kept in bf16 (with --first-last-layers-bf16)."},
      {"fp8-param-gather", K::Bool, "", S::Yes, "", "", "Keep the FP8 linears' weights in FP8: the distributed optimizer (dense and expert weights) casts its fp32 shards to FP8 and all-gathers FP8, also per layer under Megatron-FSDP (delayed and tensorwise recipes; needs --use-distributed-optimizer or --use-megatron-fsdp)."},

      // ---- tensor-parallel communication overlap (docs/overlap.md) --------------------------------------
      {"tp-comm-overlap-disable-qkv", K::Bool, "", S::Yes, "", "", "fp8tron extension named after Megatron's tp_comm_overlap_disable_qkv config field (no flag in Megatron): with --tp-comm-overlap, no all-gather/reduce-scatter overlap in qkv's forward and dgrad (bulk overlaps stay)."},
      {"tp-comm-overlap-disable-fc1", K::Bool, "", S::Yes, "", "", "fp8tron extension named after Megatron's tp_comm_overlap_disable_fc1 config field (no flag in Megatron): with --tp-comm-overlap, no all-gather/reduce-scatter overlap in fc1's forward and dgrad (bulk overlaps stay)."},
      {"use-ascend-mc2", K::Bool, "", S::Yes, "", "", "MindSpeed: fused all-gather+matmul / matmul+reduce-scatter in the tensor-parallel linears; on NVIDIA GPUs the --tp-comm-overlap schedule (plus the output layer). Needs --sequence-parallel."},
      {"use-ascend-coc", K::Bool, "", S::Yes, "", "", "MindSpeed communication-over-computation: each tensor-parallel collective split into --coc-parallel-num pieces overlapped with the GEMMs. Needs --sequence-parallel."},
      {"coc-parallel-num", K::Int, "1", S::Yes, "", "1|2|4|8", "MindSpeed: pieces per GEMM with --use-ascend-coc."},
      {"coc-mode", K::Int, "-1", S::Yes, "", "-1|0|1|2", "MindSpeed: -1 auto (0 with one piece, else 2), 0 original linears, 1 rewritten linears without splitting, 2 CoC."},
      {"coc-fused-kernel", K::Bool, "", S::Yes, "", "", "MindSpeed: Ascend's fused CoC kernels; on NVIDIA GPUs the ring-exchange schedule of --use-ascend-mc2 (--coc-parallel-num unused)."},
      {"overlap-p2p-communication", K::Bool, "", S::Yes, "", "", "Older Megatron's spelling: overlap pipeline p2p communication with computation (the default now; no effect)."},

      // ---- data ------------------------------------------------------------------------------
      {"data-path", K::StringList, "", S::Yes, "", "", "Dataset prefixes, optionally weighted: [w1] p1 [w2] p2 ..."},
      {"split", K::String, "", S::Yes, "", "", "Train/valid/test split of --data-path, e.g. 969,30,1 (default with --data-path: the legacy 969, 30, 1, with Megatron's warning; ignored with --mock-data, as in Megatron)."},
      {"train-data-path", K::StringList, "", S::Yes, "", "", "Training dataset prefixes."},
      {"valid-data-path", K::StringList, "", S::Yes, "", "", "Validation dataset prefixes."},
      {"test-data-path", K::StringList, "", S::Yes, "", "", "Test dataset prefixes."},
      {"data-cache-path", K::String, "", S::Yes, "", "", "Where to cache dataset indices."},
      {"tokenizer-type", K::String, "", S::Yes, "", "GPT2BPETokenizer|HuggingFaceTokenizer|SentencePieceTokenizer|GPTSentencePieceTokenizer|Llama2Tokenizer|TikTokenizer|NullTokenizer", "Tokenizer (default GPT2BPETokenizer, pretrain_gpt.py's default; it needs --vocab-file and --merge-file). Follows Megatron-LM d98e8a6: Llama2Tokenizer and the SentencePiece types add no BOS or special tokens, NullTokenizer has --vocab-size ids with eod = vocab-size - 1."},
      {"vocab-file", K::String, "", S::Yes, "", "", "Vocabulary file."},
      {"merge-file", K::String, "", S::Yes, "", "", "BPE merges file."},
      {"tokenizer-model", K::String, "", S::Yes, "", "", "Tokenizer model file."},
      {"eod-mask-loss", K::Bool, "", S::Yes, "", "", "Mask the loss at end-of-document tokens."},
      {"reset-position-ids", K::Bool, "", S::Yes, "", "", "Restart position ids after each end-of-document token."},
      {"reset-attention-mask", K::Bool, "", S::Yes, "", "", "Do not attend across end-of-document tokens."},
      {"num-workers", K::Int, "2", S::Yes, "", "", "Batches the loader thread prepares ahead (0: load on demand)."},
      {"dataloader-type", K::String, "", S::Yes, "", "single|cyclic|external", "single (default): samples in order from the consumed count; cyclic: a new random order every epoch (torch.randperm seeded with the epoch, per data-parallel bucket unless --no-data-sharding), cycled forever. external is refused."},

      // ---- checkpointing ---------------------------------------------------------------------
      {"save", K::String, "", S::Yes, "", "", "Directory to save checkpoints to (iter_NNNNNNN/ + latest_checkpointed_iteration.txt)."},
      {"load", K::String, "", S::Yes, "", "", "Directory to load a checkpoint from (any parallel layout)."},
      {"save-interval", K::Int, "", S::Yes, "", "", "Iterations between checkpoints (with --save; one is also saved at the end and on exit)."},
      {"no-save-optim", K::Bool, "", S::Yes, "", "", "Do not save the optimizer state."},
      {"no-save-rng", K::Bool, "", S::Yes, "", "", "Do not save the RNG state."},
      {"no-load-optim", K::Bool, "", S::Yes, "", "", "Do not load the optimizer state (nor the LR scheduler and loss scaler)."},
      {"no-load-rng", K::Bool, "", S::Yes, "", "", "Do not load the RNG state."},
      {"finetune", K::Bool, "", S::Yes, "", "", "Load weights only and reset the iteration count."},
      {"exit-signal-handler", K::Bool, "", S::Yes, "", "", "Save and exit cleanly on SIGTERM (--exit-signal)."},
      {"exit-signal-handler-for-training", K::Bool, "", S::Yes, "", "", "On SIGINT or SIGTERM, shut training down in order at the next iteration, without saving."},
      {"async-save", K::Bool, "", S::Yes, "", "", "Save checkpoints asynchronously: training waits only for the copy to host memory."},
      {"use-checkpoint-args", K::Bool, "", S::Yes, "", "", "Take the model arguments from the checkpoint --load names (the parallel layout stays this run's)."},
      {"use-mp-args-from-checkpoint-args", K::Bool, "", S::Yes, "", "", "With --use-checkpoint-args, take the tensor-, pipeline- (and virtual) and expert-parallel sizes from the checkpoint too."},
      {"no-verify-integrity", K::Bool, "", S::Yes, "", "", "fp8tron: do not verify checkpoint tensors against their checksums on load."},
      {"ckpt-format", K::String, "torch_dist", S::Yes, "", "torch|torch_dist|zarr|fsdp_dtensor", "The format of Megatron checkpoints --load reads (torch_dist or torch, as Megatron: a torch_dist checkpoint with --ckpt-format torch needs --auto-detect-ckpt-format). Given explicitly as torch_dist with --save: checkpoints are written in Megatron's torch_dist format, which Megatron-LM resumes (GPT models with Adam, the distributed optimizer's state in Megatron's fully_reshardable layout, and MoE with --transformer-impl local, without FP8 or Megatron-FSDP; docs/checkpoints.md). Otherwise fp8tron saves its own format (safetensors shards + JSON metadata)."},

#include "trainer/cli/flag_table_megatron.inc"

      // ---- for fp8tron's own tests only (hidden from --help and the argument list) -----------------
      {"fp8tron-test-kill-at", K::String, "", S::Yes, "", "", "TESTS ONLY: SIGKILL this process at the named checkpoint step, NAME[@HIT] (checkpoint/fault_points.h)."},
      {"fp8tron-test-inject-nan", K::String, "", S::Yes, "", "", "TESTS ONLY: ITER[:PARAM]: at iteration ITER make the loss (or PARAM's gradient) NaN."},
      {"fp8tron-test-fp8-attention-emulated", K::Bool, "", S::Yes, "", "", "TESTS ONLY: --fp8-dot-product-attention through the emulated path (fake quantization around fp32 products) on the GPU too, as the reference its cuDNN kernels are compared with."},
      {"fp8tron-test-node-name", K::String, "", S::Yes, "", "", "TESTS ONLY: the node name the rerun engine records and compares instead of the host name."},
  };
  return table;
}

const FlagSpec* find_flag(const std::string& name) {
  static const std::unordered_map<std::string, const FlagSpec*> index = [] {
    std::unordered_map<std::string, const FlagSpec*> m;
    for (const auto& f : flag_table()) m.emplace(f.name, &f);
    return m;
  }();
  auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

bool is_test_flag(const FlagSpec& spec) { return std::string(spec.name).rfind("fp8tron-test-", 0) == 0; }

std::vector<std::string> all_flag_names() {
  std::vector<std::string> names;
  for (const auto& f : flag_table()) names.emplace_back(f.name);
  return names;
}

}  // namespace fp8tron
