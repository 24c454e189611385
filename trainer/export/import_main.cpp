// fp8tron-import: a Hugging Face model directory to an fp8tron checkpoint (see hf_import.h).
//   fp8tron-import --hf HF_DIR --save CKPT_DIR [fp8tron flags ...]
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/text.h"
#include "trainer/export/hf_import.h"

namespace {
const char* kUsage =
    "usage: fp8tron-import --hf HF_DIR --save CKPT_DIR [--reference-tokens N] [fp8tron flags ...]\n"
    "       fp8tron-import --hf HF_DIR --print-flags\n"
    "Reads a Hugging Face model (config.json + model.safetensors or its shards: GPT2LMHeadModel,\n"
    "LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM or\n"
    "DeepseekV3ForCausalLM) and writes an\n"
    "fp8tron checkpoint at iteration 0 into CKPT_DIR. The model's fp8tron flags, from config.json,\n"
    "are printed and written to CKPT_DIR/model_flags.txt; train with\n"
    "  fp8tron --load CKPT_DIR --finetune <those flags> <data, batch and optimizer flags>\n"
    "Further flags (e.g. --bf16, --make-vocab-size-divisible-by N, --rotary-interleaved) shape the\n"
    "checkpoint as the training run will; a flag that contradicts config.json is refused.\n"
    "--reference-tokens N also writes CKPT_DIR/fp8tron_reference.safetensors: N random token ids and\n"
    "fp8tron's fp32 logits for them, computed from the written checkpoint.\n";

int64_t parse_tokens(const std::string& value) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(value, &used);
    if (used == value.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw fp8tron::UserError("--reference-tokens " + value + ": expected a non-negative integer");
}
}

int main(int argc, char** argv) {
  using namespace fp8tron;
  try {
    ImportOptions o;
    bool print_only = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "--print-flags") {
        print_only = true;
        continue;
      }
      if ((a == "--hf" || a == "--save" || a == "--reference-tokens") && i + 1 >= argc) throw UserError(a + " needs a value; --help shows the usage");
      if (a == "--hf") o.hf_dir = argv[++i];
      else if (a == "--save") o.save = argv[++i];
      else if (a == "--reference-tokens") o.reference_tokens = parse_tokens(argv[++i]);
      else o.flags.push_back(a);  // an fp8tron flag (checked by the trainer's parser)
    }
    if (print_only) {
      if (o.hf_dir.empty()) throw UserError("--hf is required: the Hugging Face model directory");
      std::printf("%s\n", join(hugging_face_model_flags(o.hf_dir), " ").c_str());
      return 0;
    }
    const ImportResult r = import_hugging_face(o);
    std::printf("imported %s as a %s model into %s at iteration 0 (%lld tensors, %s)\n", o.hf_dir.c_str(),
                r.format.c_str(), o.save.c_str(), (long long)r.tensors, human_bytes(double(r.bytes)).c_str());
    for (const auto& note : r.notes) std::printf("note: %s\n", note.c_str());
    if (!r.reference_file.empty()) std::printf("fp8tron's reference logits: %s\n", r.reference_file.c_str());
    std::printf("model flags (also in %s):\n  %s\n", r.flags_file.c_str(), join(r.flags, " ").c_str());
    std::printf("train from it with: fp8tron --load %s --finetune <model flags> <data, batch and optimizer flags>\n",
                o.save.c_str());
    return 0;
  } catch (const UserError& e) {
    std::fprintf(stderr, "fp8tron-import: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8tron-import: internal error: %s\n", e.what());
    return 2;
  }
}
