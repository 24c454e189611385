// Import of a Hugging Face model directory (config.json + model.safetensors, or shards listed in
// model.safetensors.index.json) as an fp8tron checkpoint at iteration 0, which training loads
// with --load DIR --finetune (weights only):
//   gpt2   GPT2LMHeadModel: Conv1D weights ([in, out]) transposed, the fused c_attn rows
//          regrouped into Megatron's per-group QKV, learned positions, LayerNorm, tanh GeLU
//   llama  LlamaForCausalLM: q/k/v fused per query group (GQA), gate and up stacked into
//          SwiGLU's linear_fc1, RMSNorm, RoPE (rotate-half, fp8tron's default; with
//          --rotary-interleaved the rows are permuted as the exporter's inverse), rope_theta and
//          Llama 3.1 rope scaling
//   qwen2    Qwen2ForCausalLM: the llama mapping with biases on q, k and v only
//   mixtral  MixtralForCausalLM: the llama part, and per layer the router (block_sparse_moe.gate)
//          and the experts (w1 gate and w3 up stacked as each expert's linear_fc1, w2 as fc2);
//          the post-attention norm becomes the MoE layer's pre_mlp_layernorm
//   qwen2_moe  Qwen2MoeForCausalLM: q/k/v biases, dense and MoE layers (mlp_only_layers,
//          decoder_sparse_step), the shared expert and its sigmoid gate, the router's softmax
//          before top-k unless norm_topk_prob
//   deepseek_v3  DeepseekV3ForCausalLM: multi-latent attention (with or without q_lora_rank;
//          rotary rows permuted when rope_interleave is false), default or YaRN rope, dense
//          first layers, MoE layers with the sigmoid router, e_score_correction_bias as the
//          expert bias, group-limited routing, routed_scaling_factor and shared experts
// config.json becomes fp8tron flags (the same ones the trainer needs to build the model); the
// caller's extra flags (e.g. --bf16, --make-vocab-size-divisible-by) are added, and a flag that
// contradicts config.json is refused. Anything the model cannot express (an activation,
// rope_scaling type, bias layout, ...) is refused with one line naming the config field; nothing
// is written then. The checkpoint goes through the save's atomic commit: a failure leaves no
// iter_0000000 behind.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp8tron {

struct ImportOptions {
  std::string hf_dir;              // Hugging Face directory (config.json, *.safetensors)
  std::string save;                // checkpoint directory to write (iter_0000000 and the tracker)
  std::vector<std::string> flags;  // further fp8tron flags (parallel layout is irrelevant: the checkpoint is global)
  // > 0: also write <save>/fp8tron_reference.safetensors: "input_ids" [1, n] (random, seed 1234)
  // and the fp32 "logits" [1, n, vocab] fp8tron computes from the written checkpoint (as
  // fp8tron-export --reference-tokens does; the tests compare transformers' logits with them).
  int64_t reference_tokens = 0;
};

struct ImportResult {
  std::string format;               // gpt2 | llama | qwen2 | mixtral | qwen2_moe | deepseek_v3
  std::vector<std::string> flags;   // the model's fp8tron flags, from config.json
  std::vector<std::string> notes;   // what differs slightly from Hugging Face's class (one line each)
  int64_t tensors = 0;
  uint64_t bytes = 0;               // of the rank file
  std::string flags_file;           // <save>/model_flags.txt
  std::string reference_file;       // with reference_tokens
};

// The fp8tron flags that describe the model in `hf_dir`/config.json (UserError naming an
// unsupported field).
std::vector<std::string> hugging_face_model_flags(const std::string& hf_dir);

ImportResult import_hugging_face(const ImportOptions& options);

}  // namespace fp8tron
