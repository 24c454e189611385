#!/usr/bin/env python3
"""fp8tron-import end to end, on the CPU in fp32: a tiny random Hugging Face model (built from a
config in code, no hub access) is imported, and fp8tron's logits from the imported checkpoint
must match transformers' logits of the original model; then fp8tron trains from it.

  gpt2          GPT2LMHeadModel (Conv1D, fused c_attn, learned positions, tied embeddings)
  llama         LlamaForCausalLM with GQA, an untied head, rope_theta 500000, saved in shards
  llama_scaled  LlamaForCausalLM with tied embeddings, biases and Llama 3.1 rope scaling
  qwen2         Qwen2ForCausalLM (q/k/v biases only, GQA, tied embeddings)
  mixtral       MixtralForCausalLM (router, 4 experts of which 2 per token, GQA)
  qwen2_moe     Qwen2MoeForCausalLM (q/k/v biases, shared expert with its gate, softmax before top-k,
                a dense layer among MoE ones)
  deepseek_v3   DeepseekV3ForCausalLM: multi-latent attention with a query bottleneck, YaRN, a dense
                layer then MoE layers (sigmoid router, expert bias, group-limited routing, scaling
                factor, two shared experts)
  deepseek_v3_no_q_lora  the same without q_lora_rank, rope_interleave false (rotary rows
                permuted on import), one expert per token, no groups
  deepseek_v3_dense  dense layers only, YaRN with mscale_all_dim but no mscale (transformers'
                inferred cos/sin factor)
  refusals      unsupported config fields (Llama's, and DeepSeek-V3's routing and YaRN settings) are
                refused with one line naming the field, and no checkpoint is left behind
  export_<kind> fp8tron trains a tiny model for 3 iterations, fp8tron-export writes it and
                transformers' logits of the export equal fp8tron's: qwen2, mixtral, qwen2_moe,
                deepseek_v3 (MoE with groups, expert bias, scaling, shared experts),
                deepseek_v3_plain (no q_lora_rank, top-1, no groups)
  export_refusals  MoE models no Hugging Face class computes are refused naming the flag

usage: hf_import_test.py CASE BUILD_DIR
fp8tron's logits come from `fp8tron-import --reference-tokens`, which reads the written checkpoint
back into fp8tron's model, and for the dense models also from `fp8tron-export --reference-tokens`
run on the imported checkpoint (whose exported tensors must be the original ones). Exits 77 (ctest's
skip) when transformers is not installed (scripts/setup.sh installs it into .venv).
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:
    print(f"SKIP: {e}; scripts/setup.sh installs transformers into .venv")
    sys.exit(77)

TOLERANCE = 1e-4
# Models added with the MoE export and the DeepSeek-V3 import are held to fp32 rounding.
TIGHT = 1e-6
TIGHT_CASES = ("qwen2", "mixtral", "qwen2_moe", "deepseek_v3", "deepseek_v3_no_q_lora", "deepseek_v3_dense")
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if expect_ok and p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited with {p.returncode}")
    return p


def perturb(model):
    # Random init leaves norms at 1 and biases at 0, which would hide a mixed-up mapping.
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        # DeepSeek-V3's expert bias is a buffer: large enough to change which experts are chosen.
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.add_(0.2 * torch.randn(b.shape, generator=g))


def make_model(case, directory):
    torch.manual_seed(0)
    if case == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=100,
                                         bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
        shard = None
    elif case == "llama":
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                          max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                                          bos_token_id=0, eos_token_id=0)
        model = transformers.LlamaForCausalLM(config)
        shard = "30KB"  # several files and model.safetensors.index.json
    elif case == "mixtral":
        config = transformers.MixtralConfig(hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                            num_experts_per_tok=2, vocab_size=100, max_position_embeddings=128,
                                            bos_token_id=0, eos_token_id=0)
        model = transformers.MixtralForCausalLM(config)
        shard = None
    elif case == "qwen2":
        config = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                          max_position_embeddings=128, tie_word_embeddings=True,
                                          bos_token_id=0, eos_token_id=0)
        model = transformers.Qwen2ForCausalLM(config)
        shard = None
    elif case == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(hidden_size=64, intermediate_size=80, moe_intermediate_size=32,
                                             shared_expert_intermediate_size=40, num_hidden_layers=3,
                                             num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                             num_experts_per_tok=2, vocab_size=100, max_position_embeddings=128,
                                             mlp_only_layers=[1], bos_token_id=0, eos_token_id=0)
        model = transformers.Qwen2MoeForCausalLM(config)
        shard = None
    elif case.startswith("deepseek_v3"):
        plain = case == "deepseek_v3_no_q_lora"
        yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4096,
                "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
        config = transformers.DeepseekV3Config(
            hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=2 if plain else 3,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4 if plain else 8,
            num_experts_per_tok=1 if plain else 4, n_group=1 if plain else 4, topk_group=1 if plain else 2,
            norm_topk_prob=not plain, routed_scaling_factor=1.0 if plain else 2.5, n_shared_experts=1 if plain else 2,
            first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None if plain else 24, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=12, vocab_size=100, rms_norm_eps=1e-6,
            max_position_embeddings=128 if plain else 16384, rope_interleave=not plain,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0} if plain else yarn,
            tie_word_embeddings=plain, bos_token_id=0, eos_token_id=0)
        if case == "deepseek_v3_dense":
            config.first_k_dense_replace = config.num_hidden_layers
            config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                      "original_max_position_embeddings": 4096, "mscale_all_dim": 0.8}
            config.max_position_embeddings = 8192
        model = transformers.DeepseekV3ForCausalLM(config)
        shard = None
    elif case == "llama_scaled":
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=4, vocab_size=100,
                                          max_position_embeddings=16384, tie_word_embeddings=True,
                                          attention_bias=True, mlp_bias=True,
                                          rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": 8192},
                                          bos_token_id=0, eos_token_id=0)
        model = transformers.LlamaForCausalLM(config)
        shard = None
    else:
        raise SystemExit(f"unknown case {case}")
    perturb(model)
    model.eval()
    if shard:
        model.save_pretrained(directory, max_shard_size=shard)
    else:
        model.save_pretrained(directory)
    return model


def losses(output):
    return [float(x) for x in re.findall(r"lm loss: ([0-9.eE+-]+)", output)]


def compare(case, model, reference_file, tool, tolerance=None):
    tolerance = tolerance or (TIGHT if case in TIGHT_CASES else TOLERANCE)
    reference = load_file(reference_file)
    with torch.no_grad():
        expected = model(reference["input_ids"]).logits.float()
    got = reference["logits"]
    relative = ((got - expected).norm() / expected.norm()).item()
    same_argmax = (got.argmax(-1) == expected.argmax(-1)).float().mean().item()
    check(got.shape == expected.shape and relative <= tolerance and same_argmax == 1.0,
          f"{case}: fp8tron's logits ({tool} --reference-tokens) vs transformers': "
          f"relative difference {relative:.2e} (tolerance {tolerance:.0e}), same argmax at "
          f"{100 * same_argmax:.0f}% of positions")


def load_model(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def import_and_compare(case, build):
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, ckpt, exported = (os.path.join(tmp, d) for d in ("hf", "ckpt", "exported"))
        model = make_model(case, hf_dir)
        if case == "llama":
            check(os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")), "the llama model is sharded")
        out = run([f"{build}/fp8tron-import", "--hf", hf_dir, "--save", ckpt, "--reference-tokens", "48"]).stdout
        print(out.strip())
        flags = open(os.path.join(ckpt, "model_flags.txt")).read().split()
        printed = run([f"{build}/fp8tron-import", "--hf", hf_dir, "--print-flags"]).stdout.split()
        check(printed == flags, "--print-flags prints the flags model_flags.txt holds")

        # fp8tron's logits from the imported checkpoint against transformers' from the original.
        tokens = 48
        compare(case, model, os.path.join(ckpt, "fp8tron_reference.safetensors"), "fp8tron-import")
        if case == "llama":
            # --rotary-interleaved: q and k rows permuted to channel pairs, the same logits.
            interleaved = os.path.join(tmp, "ckpt_interleaved")
            run([f"{build}/fp8tron-import", "--hf", hf_dir, "--save", interleaved, "--reference-tokens", "48",
                 "--rotary-interleaved", "--norm-epsilon", "1e-5"])
            compare("llama --rotary-interleaved", model, os.path.join(interleaved, "fp8tron_reference.safetensors"),
                    "fp8tron-import")
        run([f"{build}/fp8tron-export", "--load", ckpt, "--output", exported, "--reference-tokens", str(tokens)])
        compare(case, model, os.path.join(exported, "fp8tron_reference.safetensors"), "fp8tron-export")
        config = json.load(open(os.path.join(exported, "config.json")))
        check(config["architectures"] == model.config.architectures,
              f"{case}: exported as {config['architectures']}, imported from {model.config.architectures}")
        # Import then export gives back the same tensors (the exporter is the import's inverse; the
        # MoE experts are written per expert and fused by transformers as it loads them). Without
        # rope_interleave the rotary rows come back permuted, as rope_interleave true computes alike.
        if case != "deepseek_v3_no_q_lora":
            back = load_model(exported).state_dict()
            original = model.state_dict()
            worst = max((back[k] - v).abs().max().item() for k, v in original.items() if k in back)
            check(set(back) == set(original) and worst == 0,
                  f"{case}: export of the imported checkpoint gives back the original tensors (max difference {worst:g})")

        # A short training run from the imported weights: they load, and the loss falls.
        train = [f"{build}/fp8tron", "--load", ckpt, "--finetune", *flags, "--mock-data", "--seq-length", "32",
                 "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "3e-3", "--lr-warmup-iters", "1",
                 "--train-iters", "8", "--log-interval", "1", "--eval-iters", "0", "--device", "cpu", "--seed", "3",
                 "--hidden-dropout", "0", "--attention-dropout", "0"]
        log = run(train).stdout
        check("successfully loaded checkpoint" in log, f"{case}: training loads the imported checkpoint")
        values = losses(log)
        check(len(values) == 8 and all(math.isfinite(v) for v in values) and values[-1] < values[0],
              f"{case}: 8 iterations from the imported weights, loss finite and falling: {values}")


def refusals(build):
    with tempfile.TemporaryDirectory() as tmp:
        def refused_from(base, change, field, flags=()):
            config = json.load(open(os.path.join(base, "config.json")))
            d = os.path.join(tmp, "variant")
            subprocess.run(["rm", "-rf", d, os.path.join(tmp, "ckpt")], check=True)
            subprocess.run(["cp", "-r", base, d], check=True)
            change(config)
            json.dump(config, open(os.path.join(d, "config.json"), "w"))
            p = run([f"{build}/fp8tron-import", "--hf", d, "--save", os.path.join(tmp, "ckpt"), *flags], expect_ok=False)
            lines = p.stdout.strip().splitlines()
            check(p.returncode == 1 and len(lines) == 1 and field in lines[0] and
                  not os.path.exists(os.path.join(tmp, "ckpt", "iter_0000000")),
                  f"refused naming {field}: {lines}")

        base = os.path.join(tmp, "hf")
        make_model("llama", base)

        def refused(change, field, flags=()):
            refused_from(base, change, field, flags)

        refused(lambda c: c.update(model_type="bert"), "model_type")
        refused(lambda c: c["rope_parameters"].update(rope_type="yarn", factor=4.0), "rope_type")
        refused(lambda c: c.update(hidden_act="gelu"), "hidden_act")
        refused(lambda c: c.update(attention_bias=True), "attention_bias")
        refused(lambda c: c.update(quantization_config={"quant_method": "fp8"}), "quantization_config")
        refused(lambda c: c.update(sliding_window=16), "sliding_window")
        refused(lambda c: None, "--hidden-size", flags=("--hidden-size", "128"))

        # DeepSeek-V3 routing and rotary settings fp8tron's model would compute differently.
        deepseek = os.path.join(tmp, "deepseek")
        make_model("deepseek_v3", deepseek)
        refused_from(deepseek, lambda c: c.update(topk_group=1), "topk_group")  # top-4 of 1 group: group score top-4
        refused_from(deepseek, lambda c: c.update(norm_topk_prob=False), "norm_topk_prob")
        refused_from(deepseek, lambda c: c.update(n_shared_experts=0), "n_shared_experts")
        refused_from(deepseek, lambda c: c["rope_parameters"].update(original_max_position_embeddings=2048),
                     "original_max_position_embeddings")
        refused_from(deepseek, lambda c: c["rope_parameters"].update(truncate=False), "rope_parameters.truncate")


LLAMA_FLAGS = ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
               "--group-query-attention", "--num-query-groups", "2", "--untie-embeddings-and-output-weights"]
MLA_FLAGS = ["--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8",
             "--v-head-dim", "8", "--qk-layernorm", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
             "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--norm-epsilon", "1e-6"]
EXPORTS = {
    "qwen2": (["--add-qkv-bias"], "Qwen2ForCausalLM"),
    "mixtral": (["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16"], "MixtralForCausalLM"),
    "qwen2_moe": (["--add-qkv-bias", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16",
                   "--moe-shared-expert-intermediate-size", "24", "--moe-shared-expert-gate", "--moe-router-pre-softmax",
                   "--moe-layer-freq", "([1]*1+[0]*1+[1]*1)"], "Qwen2MoeForCausalLM"),
    "deepseek_v3": (MLA_FLAGS + ["--q-lora-rank", "24", "--num-experts", "8", "--moe-router-topk", "4",
                                 "--moe-ffn-hidden-size", "16", "--moe-shared-expert-intermediate-size", "32",
                                 "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                                 "--moe-router-bias-update-rate", "0.05", "--moe-router-num-groups", "4",
                                 "--moe-router-group-topk", "2", "--moe-router-topk-scaling-factor", "2.5",
                                 "--moe-layer-freq", "([0]*1+[1]*2)"], "DeepseekV3ForCausalLM"),
    "deepseek_v3_plain": (MLA_FLAGS + ["--num-experts", "4", "--moe-router-topk", "1", "--moe-ffn-hidden-size", "16",
                                       "--moe-shared-expert-intermediate-size", "16", "--moe-router-score-function",
                                       "sigmoid"], "DeepseekV3ForCausalLM"),
}


def train_tiny(build, ckpt, flags):
    # Large steps so that norms and routers move well away from their initial values.
    run([f"{build}/fp8tron", "--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length",
         "16", "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "2e-2", "--train-iters", "3",
         "--vocab-size", "64", "--mock-data", "--device", "cpu", "--eval-iters", "0", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--seed", "5", "--save", ckpt, *flags])


def export_trained(kind, build):
    flags, architecture = EXPORTS[kind]
    if not kind.startswith("deepseek_v3"):
        flags = LLAMA_FLAGS + flags
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, exported = os.path.join(tmp, "ckpt"), os.path.join(tmp, "hf")
        train_tiny(build, ckpt, flags)
        print(run([f"{build}/fp8tron-export", "--load", ckpt, "--output", exported, "--reference-tokens", "16"]).stdout.strip())
        model = load_model(exported)
        check(type(model).__name__ == architecture, f"export_{kind}: transformers loads a {type(model).__name__}")
        if kind == "deepseek_v3":
            bias = torch.stack([model.model.layers[i].mlp.gate.e_score_correction_bias for i in (1, 2)])
            check(bias.abs().max().item() > 0, f"export_{kind}: the trained expert bias is exported ({bias.tolist()})")
        compare(f"export_{kind}", model, os.path.join(exported, "fp8tron_reference.safetensors"), "fp8tron-export", TIGHT)


def export_refusals(build):
    with tempfile.TemporaryDirectory() as tmp:
        def refused(flags, what):
            ckpt, out = os.path.join(tmp, "ckpt"), os.path.join(tmp, "hf")
            subprocess.run(["rm", "-rf", ckpt, out], check=True)
            train_tiny(build, ckpt, flags)
            p = run([f"{build}/fp8tron-export", "--load", ckpt, "--output", out], expect_ok=False)
            lines = p.stdout.strip().splitlines()
            check(p.returncode == 1 and len(lines) == 1 and what in lines[0] and
                  not os.path.exists(os.path.join(out, "model.safetensors")),
                  f"export refused naming {what}: {lines}")

        moe = LLAMA_FLAGS + ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16"]
        refused(moe + ["--moe-expert-capacity-factor", "1.0"], "--moe-expert-capacity-factor")
        refused(moe + ["--moe-router-pre-softmax"], "--moe-router-pre-softmax")
        refused(moe + ["--moe-router-score-function", "sigmoid"], "--moe-router-score-function sigmoid")
        refused(moe + ["--moe-input-jitter-eps", "0.01"], "--moe-input-jitter-eps")
        refused(moe + ["--moe-layer-freq", "([0]*1+[1]*2)"], "--moe-layer-freq")
        refused(moe + ["--moe-shared-expert-intermediate-size", "16"], "--moe-shared-expert-gate")
        dsv3 = MLA_FLAGS + ["--num-experts", "8", "--moe-ffn-hidden-size", "16", "--moe-shared-expert-intermediate-size",
                            "16", "--moe-router-score-function", "sigmoid"]
        refused(dsv3 + ["--moe-router-topk", "2", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2"],
                "top-2")
        refused(dsv3[:-1] + ["softmax", "--moe-router-topk", "2"], "sigmoid")
        refused(dsv3 + ["--moe-router-topk", "2", "--moe-layer-freq", "([1]*1+[0]*1+[1]*1)"], "dense layers come first")


def main():
    case, build = sys.argv[1], sys.argv[2]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    if case == "refusals":
        refusals(build)
    elif case == "export_refusals":
        export_refusals(build)
    elif case.startswith("export_"):
        export_trained(case[len("export_"):], build)
    else:
        import_and_compare(case, build)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
