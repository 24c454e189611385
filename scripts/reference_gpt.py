#!/usr/bin/env python3
"""The PyTorch GPT that fp8tron races (scripts/bench.sh): the same architectures, written the way
a careful PyTorch user writes them, compiled with torch.compile.

It reads the same Megatron flags as fp8tron (a --config JSON file and command-line flags, which
win), builds the same model — learned or RoPE positions, LayerNorm or RMSNorm, GeLU (tanh) or
SwiGLU, grouped-query attention through scaled_dot_product_attention's enable_gqa, biases or
not, tied or untied output layer, the vocabulary padded as Megatron pads it — and trains it with
fp32 weights under bf16 autocast, fused AdamW and a constant learning rate on random tokens, then
prints one line of figures:

    reference | tokens/s 469123 | ms/iter 34.9 | max allocated MB 15521 | compiled

Flags it does not need (data, logging, schedules, ...) are ignored; the model and batch flags are
the ones fp8tron uses. Extra options of its own: --iters N (timed iterations, default 20),
--warmup N (default 10), --no-compile, --torchao-fp8 RECIPE (tensorwise, rowwise or
rowwise_with_gw_hp: torchao's FP8 training, convert_to_float8_training, on every linear of the
layers; the output layer stays bf16, as in fp8tron; needs the torchao package). With fp8tron's --cuda-graph-impl full_iteration it compiles
with mode="reduce-overhead" (CUDA graphs), so both sides replay graphs.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def megatron_flags(argv):
    """Megatron flags from --config and the command line (command line wins), as a dict."""
    flags = {}
    i = 0
    tokens = []
    while i < len(argv):
        a = argv[i]
        if a == "--config":
            with open(argv[i + 1]) as f:
                for k, v in json.load(f).items():
                    flags[k.replace("_", "-")] = v
            i += 2
            continue
        tokens.append(a)
        i += 1
    i = 0
    while i < len(tokens):
        a = tokens[i]
        if not a.startswith("--"):
            i += 1
            continue
        name = a[2:]
        values = []
        while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            values.append(tokens[i + 1])
            i += 1
        flags[name] = True if not values else values[0] if len(values) == 1 else values
        i += 1
    return flags


class Config:
    def __init__(self, f):
        self.layers = int(f["num-layers"])
        self.hidden = int(f["hidden-size"])
        self.heads = int(f["num-attention-heads"])
        self.head_dim = int(f.get("kv-channels", self.hidden // self.heads))
        self.groups = int(f.get("num-query-groups", self.heads)) if f.get("group-query-attention") else self.heads
        self.seq = int(f["seq-length"])
        self.swiglu = bool(f.get("swiglu", False))
        self.cuda_graphs = f.get("cuda-graph-impl") == "full_iteration"
        default_ffn = 4 * self.hidden
        if self.swiglu:
            default_ffn = int(2 * default_ffn / 3) // 64 * 64
        self.ffn = int(f.get("ffn-hidden-size", default_ffn))
        self.rope = f.get("position-embedding-type", "learned_absolute") == "rope"
        self.rotary_base = float(f.get("rotary-base", 10000))
        self.rmsnorm = f.get("normalization", "LayerNorm") == "RMSNorm"
        self.eps = float(f.get("norm-epsilon", 1e-5))
        self.bias = not f.get("disable-bias-linear", False)
        self.qkv_bias = self.bias or bool(f.get("add-qkv-bias", False))
        self.tied = not f.get("untie-embeddings-and-output-weights", False)
        divisible = int(f.get("make-vocab-size-divisible-by", 128))
        self.vocab = (int(f["vocab-size"]) + divisible - 1) // divisible * divisible
        self.micro_batch = int(f["micro-batch-size"])
        self.lr = float(f.get("lr", 3e-4))
        self.std = float(f.get("init-method-std", 0.02))


def norm(c):
    return nn.RMSNorm(c.hidden, eps=c.eps) if c.rmsnorm else nn.LayerNorm(c.hidden, eps=c.eps)


def rope_tables(c, device):
    inv = 1.0 / (c.rotary_base ** (torch.arange(0, c.head_dim, 2, device=device, dtype=torch.float32) / c.head_dim))
    angles = torch.outer(torch.arange(c.seq, device=device, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)  # Megatron's non-interleaved "rotate half" layout
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):  # x [b, heads, s, d]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        q, kv = c.heads * c.head_dim, c.groups * c.head_dim
        self.ln1 = norm(c)
        self.qkv = nn.Linear(c.hidden, q + 2 * kv, bias=c.qkv_bias)
        self.proj = nn.Linear(q, c.hidden, bias=c.bias)
        self.ln2 = norm(c)
        self.fc1 = nn.Linear(c.hidden, 2 * c.ffn if c.swiglu else c.ffn, bias=c.bias)
        self.fc2 = nn.Linear(c.ffn, c.hidden, bias=c.bias)

    def forward(self, x, cos, sin):
        c = self.c
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split([c.heads * c.head_dim, c.groups * c.head_dim, c.groups * c.head_dim], -1)
        q = q.view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = k.view(b, s, c.groups, c.head_dim).transpose(1, 2)
        v = v.view(b, s, c.groups, c.head_dim).transpose(1, 2)
        if c.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=c.groups != c.heads)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, c.heads * c.head_dim))
        h = self.fc1(self.ln2(x))
        if c.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return x + self.fc2(h)


class Gpt(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c.vocab, c.hidden)
        self.wpe = None if c.rope else nn.Embedding(c.seq, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = norm(c)
        self.head = None if c.tied else nn.Linear(c.hidden, c.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = c.std / math.sqrt(2 * c.layers) if name.endswith(("proj.weight", "fc2.weight")) else c.std
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, labels, cos, sin):
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight if self.head is None else self.head.weight)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def convert_to_torchao_fp8(model, recipe):
    """torchao's FP8 training on the layers' linears (the untied output layer stays bf16; the tied
    one is F.linear and stays bf16 anyway)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise SystemExit(f"--torchao-fp8 needs the torchao package ({e}): pip install torchao") from e
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda module, fqn: fqn != "head")


def main():
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--iters", type=int, default=20)
    own.add_argument("--warmup", type=int, default=10)
    own.add_argument("--no-compile", action="store_true")
    own.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    own.add_argument("--profile-trace", metavar="PATH",
                     help="after the timed iterations, profile 2 more with torch.profiler and write their "
                          "Chrome trace to PATH (read it with scripts/profile_summary.py PATH --steps 2)")
    own.add_argument("--torchao-fp8", choices=["tensorwise", "rowwise", "rowwise_with_gw_hp"])
    opts, rest = own.parse_known_args()
    c = Config(megatron_flags(rest))
    device = torch.device(opts.device)
    torch.manual_seed(1234)
    model = Gpt(c).to(device)
    if opts.torchao_fp8:
        convert_to_torchao_fp8(model, opts.torchao_fp8)
    compiled = not opts.no_compile and device.type == "cuda"
    # fp8tron's --cuda-graph-impl full_iteration replays each step's forward and backward as a CUDA
    # graph; the reference then does the same through torch.compile's CUDA-graph mode.
    graphed = compiled and c.cuda_graphs
    step_model = torch.compile(model, mode="reduce-overhead" if graphed else None) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=c.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=device.type == "cuda")
    cos, sin = rope_tables(c, device) if c.rope else (None, None)
    g = torch.Generator(device=device).manual_seed(1)
    data = torch.randint(0, c.vocab, (8, c.micro_batch, c.seq + 1), device=device, generator=g)
    dtype = torch.bfloat16

    def step(i):
        batch = data[i % data.shape[0]]
        with torch.autocast(device.type, dtype=dtype):
            loss = step_model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous(), cos, sin)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # A CUDA-graph output is overwritten by the next replay.
        return loss.detach().clone() if graphed else loss

    for i in range(opts.warmup):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(opts.iters):
        loss = step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / opts.iters
    tokens = c.micro_batch * c.seq
    mem = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else 0.0
    fp8 = f", torchao FP8 {opts.torchao_fp8}" if opts.torchao_fp8 else ""
    print(f"reference | tokens/s {tokens / seconds:.0f} | ms/iter {1000 * seconds:.1f} | max allocated MB {mem:.0f} | "
          f"{'compiled' if compiled else 'eager'}{', CUDA graphs' if graphed else ''}{fp8} | loss {loss.item():.3f}")
    if opts.profile_trace:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            for i in range(2):
                step(i)
            torch.cuda.synchronize()
        prof.export_chrome_trace(opts.profile_trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
