// fp8tron-export: an fp8tron checkpoint to a Hugging Face model directory (see hf_export.h).
//   fp8tron-export --load CKPT_DIR --output HF_DIR [--ckpt-step N]
//                  [--format auto|gpt2|llama|qwen2|mixtral|qwen2_moe|deepseek_v3]
//                  [--dtype auto|fp32|bf16|fp16]
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/text.h"
#include "trainer/export/hf_export.h"

namespace {
constexpr const char* kUsage =
    "usage: fp8tron-export --load CKPT_DIR --output HF_DIR [--ckpt-step N]\n"
    "                      [--format auto|gpt2|llama|qwen2|mixtral|qwen2_moe|deepseek_v3]\n"
    "                      [--dtype auto|fp32|bf16|fp16] [--reference-tokens N]\n"
    "Writes model.safetensors and config.json for transformers' GPT2LMHeadModel (learned positions,\n"
    "LayerNorm, GeLU), LlamaForCausalLM (RoPE, RMSNorm, SwiGLU, GQA), Qwen2ForCausalLM (q/k/v\n"
    "biases), MixtralForCausalLM, Qwen2MoeForCausalLM or DeepseekV3ForCausalLM (multi-latent\n"
    "attention, dense and MoE layers), as the model's flags say. --dtype auto keeps the\n"
    "training's parameter dtype; fp32 takes the fp32 main weights when the checkpoint has them.\n"
    "--reference-tokens N also writes fp8tron's logits for N random tokens (fp8tron_reference.safetensors)\n"
    "for scripts/check_hf_export.py.\n";

int64_t parse_int(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(value, &used);
    if (used == value.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw fp8tron::UserError(flag + " " + value + ": expected a non-negative integer");
}
}

int main(int argc, char** argv) {
  using namespace fp8tron;
  try {
    ExportOptions o;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (i + 1 >= argc) throw UserError(a + " needs a value (or unknown flag); --help shows the usage");
      const std::string v = argv[++i];
      if (a == "--load") o.load = v;
      else if (a == "--output") o.output = v;
      else if (a == "--format") o.format = v;
      else if (a == "--dtype") o.dtype = v;
      else if (a == "--ckpt-step") o.ckpt_step = parse_int(a, v);
      else if (a == "--reference-tokens") o.reference_tokens = parse_int(a, v);
      else throw UserError("unknown flag " + a + "; --help shows the usage");
    }
    const ExportResult r = export_hugging_face(o);
    std::printf("exported iteration %lld of %s as a %s model to %s (%lld tensors, %s)\n", (long long)r.iteration,
                o.load.c_str(), r.format.c_str(), o.output.c_str(), (long long)r.tensors, human_bytes(double(r.bytes)).c_str());
    if (r.skipped_mtp_layers > 0)
      std::printf("%lld multi-token-prediction layer%s not exported (Hugging Face's class has none)\n",
                  (long long)r.skipped_mtp_layers, r.skipped_mtp_layers == 1 ? " is" : "s are");
    for (const auto& note : r.notes) std::printf("note: %s\n", note.c_str());
    return 0;
  } catch (const UserError& e) {
    std::fprintf(stderr, "fp8tron-export: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8tron-export: internal error: %s\n", e.what());
    return 2;
  }
}
