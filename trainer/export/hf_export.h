// Export of an fp8tron checkpoint to a Hugging Face model directory (model.safetensors +
// config.json), read by transformers' classes:
//   gpt2         GPT2LMHeadModel: learned absolute positions, LayerNorm, GeLU (tanh: "gelu_new")
//                or squared ReLU ("relu2"), heads = query groups
//   llama        LlamaForCausalLM: RoPE (all dimensions; --rotary-interleaved rows permuted to
//                rotate-half; Llama 3.1 or YaRN rope_scaling) or YaRN, RMSNorm, SwiGLU, GQA
//   qwen2        Qwen2ForCausalLM: the llama part with biases on q, k and v only
//   mixtral      MixtralForCausalLM: every layer MoE, softmax router renormalised over the top k
//   qwen2_moe    Qwen2MoeForCausalLM: a shared expert behind a sigmoid gate, dense layers
//                (mlp_only_layers), --moe-router-pre-softmax as norm_topk_prob false
//   deepseek_v3  DeepseekV3ForCausalLM: multi-latent attention (--q-lora-rank optional,
//                --qk-layernorm), dense layers first, then MoE layers with a sigmoid router, the
//                expert bias, group-limited routing (groups scored by their top 2), scaling factor
//                and ungated shared experts; multi-token-prediction layers are left out (Hugging
//                Face has none); exact with --norm-epsilon 1e-6 (transformers' latent norms keep
//                that eps), else exported with a note
// MoE routing no class computes (token dropping, Sinkhorn, jitter, sqrtsoftplus, ...) is refused
// naming the flag.
// Megatron's fused tensors are split the Hugging Face way: linear_qkv (per query group: its query
// heads, one key, one value) into q/k/v (GPT-2: one Conv1D [in, out] with all queries, then keys,
// then values), SwiGLU's linear_fc1 (and each expert's) into gate and up; the padded vocabulary is cut back to the
// tokenizer's; zero-centred norm weights (--apply-layernorm-1p) get their 1 back. The FP8 extra
// state is not exported. Works from any parallel layout (the checkpoint's tensors are global).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8tron {

struct ExportOptions {
  std::string load;                 // checkpoint directory (--load of the training run)
  std::optional<int64_t> ckpt_step; // default: the tracker's iteration
  std::string output;               // Hugging Face directory to write (created)
  std::string format = "auto";      // auto | gpt2 | llama | qwen2 | mixtral | qwen2_moe | deepseek_v3
  std::string dtype = "auto";       // auto (the training's parameter dtype) | fp32 | bf16 | fp16
  // > 0: also write fp8tron_reference.safetensors: "input_ids" [1, n] (random, seed 1234) and
  // fp8tron's fp32 "logits" [1, n, vocab] for the exported weights (scripts/check_hf_export.py
  // compares transformers' logits with them).
  int64_t reference_tokens = 0;
};

struct ExportResult {
  std::string format;  // gpt2 | llama | qwen2 | mixtral | qwen2_moe | deepseek_v3
  int64_t skipped_mtp_layers = 0;  // multi-token-prediction layers not exported
  // Where transformers' class computes slightly differently from the trained model (one line each).
  std::vector<std::string> notes;
  int64_t iteration = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;  // of model.safetensors
};

// UserError for models Hugging Face's class cannot express (naming the feature) and for
// missing or damaged checkpoints.
ExportResult export_hugging_face(const ExportOptions& options);

}  // namespace fp8tron
