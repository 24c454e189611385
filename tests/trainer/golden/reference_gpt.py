#!/usr/bin/env python3
"""An independent PyTorch re-implementation of the GPT fp8tron trains in its golden-loss tests.

It shares no code with fp8tron: it reads the same flag file (JSON, Megatron flag names) and
derives everything from Megatron's semantics itself -- the padded vocabulary, the LR schedule in
samples (linear warmup from 0, cosine/linear decay to --min-lr), AdamW with Megatron's
weight-decay groups (no decay for biases and 1-D weights), global-norm clipping
(max_norm / (norm + 1e-6)), the loss (each micro-batch's mean token loss, averaged over the
micro-batches of the global batch) -- and the model: learned absolute positions, pre-LayerNorm
layers, fused QKV in Megatron's per-group head order, causal softmax attention, tanh GeLU MLP, a
final LayerNorm and the output layer tied to the word embedding over the padded vocabulary.

Only the initial weights (fp8tron's initialisation is per parameter name and seed, which this
file does not re-implement) and the token samples come from fp8tron, through
fp8tron_golden_export. Adam barely sees a change of the gradients' scale (its update is a ratio),
so the golden runs also train with SGD (torch.optim.SGD semantics: momentum, weight decay added to
the gradient), which does. With --fp8 the transformer layers' linear GEMMs are emulated in FP8 with
current (tensorwise) scaling: inputs, weights and output gradients rounded to bf16, scaled by
fp8_max / amax, cast to E4M3 (E5M2 for gradients under hybrid), multiplied in fp32.
"""
import json
import math
import struct

import torch

E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": torch.float32, "I64": torch.int64}[entry["dtype"]]
        begin, end = entry["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=dtype).reshape(entry["shape"]).clone()
    return out


class Flags:
    """The run's flags with Megatron's defaults for the few this model reads."""

    def __init__(self, path, overrides=()):
        self.values = json.load(open(path))
        for flag, value in overrides:  # command-line text: numbers become numbers
            try:
                self.values[flag] = json.loads(value) if isinstance(value, str) else value
            except ValueError:
                self.values[flag] = value

    def __getitem__(self, name):
        defaults = {"make-vocab-size-divisible-by": 128, "norm-epsilon": 1e-5, "lr-warmup-iters": 0, "min-lr": 0.0,
                    "lr-decay-style": "linear", "weight-decay": 0.01, "adam-beta1": 0.9, "adam-beta2": 0.999,
                    "adam-eps": 1e-8, "clip-grad": 1.0, "fp8-format": None, "optimizer": "adam", "sgd-momentum": 0.9}
        return self.values.get(name, defaults.get(name))


def lr_at(flags, num_steps):
    """Megatron's OptimizerParamScheduler.get_lr, in samples."""
    gbs = flags["global-batch-size"]
    max_lr, min_lr = flags["lr"], flags["min-lr"]
    warmup = flags["lr-warmup-iters"] * gbs
    decay = flags.values.get("lr-decay-iters", flags["train-iters"]) * gbs
    if warmup > 0 and num_steps <= warmup:
        return max_lr * num_steps / warmup
    style = flags["lr-decay-style"]
    if style == "constant":
        return max_lr
    if num_steps > decay:
        return min_lr
    ratio = (num_steps - warmup) / (decay - warmup)
    coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0) if style == "cosine" else 1.0 - ratio
    return min_lr + coeff * (max_lr - min_lr)


def fp8_dequantized(t, fp8_max, dtype):
    """Current scaling: bf16 values scaled by fp8_max / amax, rounded to FP8, scaled back."""
    b = t.to(torch.bfloat16).to(torch.float32)
    amax = b.abs().max()
    scale = torch.tensor(fp8_max, dtype=torch.float32) / amax if bool(torch.isfinite(amax)) and amax > 0 \
        else torch.tensor(1.0)
    scale_inv = torch.tensor(1.0, dtype=torch.float32) / scale
    return (b * scale).clamp(-fp8_max, fp8_max).to(dtype).to(torch.float32) * scale_inv


class Fp8Linear(torch.autograd.Function):
    """y = x W^T + b with the three GEMMs on FP8-rounded operands (fprop: x, W; dgrad: dy, W;
    wgrad: dy, x); the bias gradient is the plain sum of dy."""

    @staticmethod
    def forward(ctx, x, weight, bias, grad_format):
        xq = fp8_dequantized(x.reshape(-1, x.shape[-1]), E4M3_MAX, torch.float8_e4m3fn)
        wq = fp8_dequantized(weight, E4M3_MAX, torch.float8_e4m3fn)
        ctx.save_for_backward(xq, wq)
        ctx.grad_format, ctx.shape = grad_format, x.shape
        y = xq @ wq.t()
        if bias is not None:
            y = y + bias
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        xq, wq = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        fmax, dtype = (E5M2_MAX, torch.float8_e5m2) if ctx.grad_format == "hybrid" else (E4M3_MAX, torch.float8_e4m3fn)
        dyq = fp8_dequantized(dy2, fmax, dtype)
        dx = (dyq @ wq).reshape(ctx.shape)
        return dx, dyq.t() @ xq, dy2.sum(0), None


class Gpt:
    def __init__(self, flags, weights):
        self.f, self.w = flags, weights
        for t in self.w.values():
            t.requires_grad_(True)
        self.heads = flags["num-attention-heads"]
        self.layers = flags["num-layers"]
        self.eps = flags["norm-epsilon"]
        self.fp8 = flags["fp8-format"]

    def linear(self, x, name):
        weight, bias = self.w[name + ".weight"], self.w.get(name + ".bias")
        if self.fp8:
            return Fp8Linear.apply(x, weight, bias, self.fp8)
        return torch.nn.functional.linear(x, weight, bias)

    def norm(self, x, name, prefix=""):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.w[f"{name}.{prefix}weight"],
                                              self.w[f"{name}.{prefix}bias"], self.eps)

    def loss(self, tokens, labels):
        b, s = tokens.shape
        h = self.w["embedding.word_embeddings.weight"][tokens] + self.w["embedding.position_embeddings.weight"][:s]
        for i in range(self.layers):
            p = f"decoder.layers.{i}"
            qkv = self.linear(self.norm(h, p + ".self_attention.linear_qkv", "layer_norm_"), p + ".self_attention.linear_qkv")
            d = qkv.shape[-1] // (3 * self.heads)
            # Megatron's fused layout: per query group, its query heads then one key and one value.
            qkv = qkv.view(b, s, self.heads, 3, d)
            q, k, v = (qkv[:, :, :, j].transpose(1, 2) for j in range(3))  # [b, heads, s, d]
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, self.heads * d)
            h = h + self.linear(attn, p + ".self_attention.linear_proj")
            m = self.linear(self.norm(h, p + ".mlp.linear_fc1", "layer_norm_"), p + ".mlp.linear_fc1")
            h = h + self.linear(torch.nn.functional.gelu(m, approximate="tanh"), p + ".mlp.linear_fc2")
        logits = self.norm(h, "decoder.final_layernorm") @ self.w["embedding.word_embeddings.weight"].t()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def train(flags, weights, samples):
    """Per-iteration losses of --train-iters iterations from `weights` on `samples`."""
    torch.manual_seed(0)
    model = Gpt(flags, weights)
    decay = [t for n, t in model.w.items() if t.dim() > 1 and "bias" not in n]
    no_decay = [t for n, t in model.w.items() if not (t.dim() > 1 and "bias" not in n)]
    groups = [{"params": decay, "weight_decay": flags["weight-decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    if flags["optimizer"] == "sgd":  # torch.optim.SGD: weight decay added to the gradient, no dampening
        optimizer = torch.optim.SGD(groups, lr=0.0, momentum=flags["sgd-momentum"], foreach=False)
    else:  # AdamW: decoupled weight decay
        optimizer = torch.optim.AdamW(groups, lr=0.0, betas=(flags["adam-beta1"], flags["adam-beta2"]),
                                      eps=flags["adam-eps"], foreach=False)
    gbs, mbs = flags["global-batch-size"], flags["micro-batch-size"]
    micro_batches = gbs // mbs
    losses = []
    for iteration in range(flags["train-iters"]):
        optimizer.zero_grad()
        total = 0.0
        for m in range(micro_batches):
            batch = samples[iteration * gbs + m * mbs: iteration * gbs + (m + 1) * mbs]
            loss = model.loss(batch[:, :-1], batch[:, 1:])
            (loss / micro_batches).backward()
            total += loss.item()
        losses.append(total / micro_batches)
        params = list(model.w.values())
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
        clip = flags["clip-grad"]
        if clip > 0:
            coeff = clip / (norm + 1e-6)
            if coeff < 1.0:
                for p in params:
                    p.grad.mul_(coeff)
        lr = lr_at(flags, iteration * gbs)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    return losses
