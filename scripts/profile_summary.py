#!/usr/bin/env python3
"""Where a training step's GPU time goes, from a PyTorch-profiler Chrome trace written by
`fp8tron --profile --use-pytorch-profiler --tensorboard-dir DIR` (or by torch.profiler).

    scripts/profile_summary.py TRACE.json [--steps N] [--top K]

Sums the duration of every GPU kernel and memcpy/memset by name, groups the names into families
(GEMM, attention, cross entropy, norm, elementwise, optimizer, communication, copies, ...), and
prints both per step (divided by --steps, the number of profiled iterations) with their share of
the GPU's busy time, plus the idle time between kernels (launch gaps). --by-op also sums the
kernels by the outermost CPU-side operator that launched them (an aten op in the forward, the
autograd node, e.g. "evaluate_function: AddBackward0", in the backward): what to fuse next."""
import argparse
import bisect
import collections
import json
import re

FAMILIES = [
    ("fp8tron fused kernels", r"fp8tron::kernels"),
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|sendrecv"),
    ("attention", r"cudnn.*(sdpa|fmha|flash|attn)|flash|fmha|attention|sdpa|cutlass_sm90_fmha"),
    ("gemm (FP8)", r"(e4m3|e5m2|fp8|f8f6f4|sm90_xmma_gemm_e4|tma.*e4m3)"),
    ("gemm", r"gemm|cutlass|sm90_xmma|xmma_gemm|cublas|nvjet|ampere_.*gemm|sm80_.*gemm"),
    ("quantize / cast (FP8)", r"quantiz|amax|cast_|fp8tron::fp8|scaling"),
    ("cross entropy / softmax", r"softmax|log_softmax|nll|cross_entropy|logsumexp"),
    ("norm", r"layer_?norm|rms_?norm|norm_"),
    ("optimizer", r"adam|fused_adamw|multi_tensor|sgd"),
    ("reduction", r"reduce_kernel|reduction|sum_|norm_kernel|max_kernel"),
    ("embedding / index", r"embedding|index|gather|scatter"),
    ("dropout / random", r"dropout|philox|bernoulli|random"),
    ("elementwise", r"elementwise|vectorized|unrolled|fill|copy_kernel|cat_|gelu|silu|mul|add|where|clamp"),
    ("memcpy / memset", r"memcpy|memset"),
]


def family(name):
    low = name.lower()
    for fam, pattern in FAMILIES:
        if re.search(pattern, low):
            return fam
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--by-op", action="store_true", help="also sum kernel time by the launching CPU operator")
    args = ap.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        raise SystemExit("no GPU kernels in the trace (was it a CUDA run?)")
    by_name = collections.Counter()
    count = collections.Counter()
    for e in gpu:
        by_name[e["name"]] += e["dur"]
        count[e["name"]] += 1
    by_family = collections.Counter()
    for name, dur in by_name.items():
        by_family[family(name)] += dur
    busy = sum(by_name.values())
    # Idle time of the busiest stream: gaps between consecutive kernels.
    per_stream = collections.defaultdict(list)
    for e in gpu:
        per_stream[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e["dur"]))
    main_stream = max(per_stream.values(), key=lambda v: sum(b - a for a, b in v))
    main_stream.sort()
    span = main_stream[-1][1] - main_stream[0][0]
    gaps = sum(max(0.0, b[0] - a[1]) for a, b in zip(main_stream, main_stream[1:]))
    s = args.steps
    print(f"GPU busy per step {busy / s / 1000:.2f} ms over {len(gpu) // s} kernels; main stream span "
          f"{span / s / 1000:.2f} ms per step, idle gaps {gaps / s / 1000:.2f} ms ({100 * gaps / span:.1f}%)")
    print("| family | ms per step | share of GPU busy time |")
    print("| --- | --- | --- |")
    for fam, dur in by_family.most_common():
        print(f"| {fam} | {dur / s / 1000:.2f} | {100 * dur / busy:.1f}% |")
    print(f"\n| top {args.top} kernels | calls per step | ms per step | share |")
    print("| --- | --- | --- | --- |")
    for name, dur in by_name.most_common(args.top):
        short = name if len(name) < 110 else name[:107] + "..."
        print(f"| `{short}` | {count[name] / s:.0f} | {dur / s / 1000:.3f} | {100 * dur / busy:.1f}% |")
    if args.by_op:
        print_by_op(events, gpu, s, busy, args.top)


def top_level_ops(events):
    """Per CPU thread, the outermost operator intervals (sorted by start)."""
    per_tid = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            per_tid[e.get("tid")].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    tops = {}
    for tid, ops in per_tid.items():
        ops.sort(key=lambda o: (o[0], -o[1]))
        outer = []
        for o in ops:
            if not outer or o[0] >= outer[-1][1]:
                outer.append(o)
        tops[tid] = outer
    return tops


def print_by_op(events, gpu, steps, busy, top):
    tops = top_level_ops(events)
    starts = {tid: [o[0] for o in ops] for tid, ops in tops.items()}
    launcher = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            ops = tops.get(e.get("tid"), [])
            i = bisect.bisect_right(starts.get(e.get("tid"), []), e["ts"]) - 1
            name = ops[i][2] if i >= 0 and ops[i][1] >= e["ts"] else "(no operator)"
            launcher[e["args"]["correlation"]] = name.replace("autograd::engine::evaluate_function: ", "bwd: ")
    by_op = collections.Counter()
    calls = collections.Counter()
    for e in gpu:
        name = launcher.get(e.get("args", {}).get("correlation"), "(unattributed)")
        by_op[name] += e["dur"]
        calls[name] += 1
    print(f"\n| top {top} launching operators | kernels per step | ms per step | share |")
    print("| --- | --- | --- | --- |")
    for name, dur in by_op.most_common(top):
        print(f"| `{name[:100]}` | {calls[name] / steps:.0f} | {dur / steps / 1000:.3f} | {100 * dur / busy:.1f}% |")


if __name__ == "__main__":
    main()
