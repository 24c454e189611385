#!/usr/bin/env python3
"""Checks a directory written by `fp8tron-export --reference-tokens N` with Hugging Face
transformers: the class config.json names (GPT-2, Llama, Qwen2, Mixtral, Qwen2-MoE,
DeepSeek-V3) loads it and gives fp8tron's logits.

    build/fp8tron-export --load CKPT --output HF_DIR --reference-tokens 64
    python3 scripts/check_hf_export.py HF_DIR [--tolerance 1e-4]

Needs torch, transformers and safetensors (pip install transformers). Runs in fp32 on the CPU
(or --device cuda); exits 0 when the relative difference of the logits is within the tolerance.
"""
import argparse
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hf_dir")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    reference = load_file(f"{args.hf_dir}/fp8tron_reference.safetensors")
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model = model.to(args.device).eval()
    with torch.no_grad():
        logits = model(reference["input_ids"].to(args.device)).logits.float().cpu()
    expected = reference["logits"]
    if logits.shape != expected.shape:
        print(f"FAIL: logits shape {tuple(logits.shape)}, fp8tron's {tuple(expected.shape)}")
        return 1
    relative = ((logits - expected).norm() / expected.norm()).item()
    same_argmax = (logits.argmax(-1) == expected.argmax(-1)).float().mean().item()
    ok = relative <= args.tolerance
    print(f"{'ok' if ok else 'FAIL'}: {type(model).__name__} from {args.hf_dir}: relative logit difference "
          f"{relative:.2e} (tolerance {args.tolerance:.0e}), same argmax for {100 * same_argmax:.1f}% of positions")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
