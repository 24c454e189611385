#!/usr/bin/env python3
"""Where a training step's GPU time goes, from a PyTorch-profiler Chrome trace written by
`fp8tron --profile --use-pytorch-profiler --tensorboard-dir DIR` (or by torch.profiler).

    scripts/profile_summary.py TRACE.json [--steps N] [--top K] [--by-op] [--gaps N]

Sums the duration of every GPU kernel and memcpy/memset by name, groups the names into families
(GEMM, attention, cross entropy, norm, elementwise, optimizer, communication, copies, ...), and
prints both per step (divided by --steps, the number of profiled iterations) with their share of
the GPU's busy time, plus the idle time between kernels (launch gaps): the main stream's, and the
time when no stream at all is busy. --by-op also sums the
kernels by the outermost CPU-side operator that launched them (an aten op in the forward, the
autograd node, e.g. "evaluate_function: AddBackward0", in the backward): what to fuse next.
--gaps N explains the idle time of the busiest stream: a histogram of the gaps by length, the N
largest with the kernels and operators around them and what the main thread was doing, and how
much idle time follows a host sync, is launch-bound (many short gaps) or neither."""
import argparse
import bisect
import collections
import json
import math
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

# Runtime calls that block the host until the GPU has drained: while one runs nothing new is
# launched, so the GPU idles from the moment it catches up until the host launches again.
# (cudaMemcpyAsync is not one: a copy to the host shows its wait as the cudaStreamSynchronize after it.)
HOST_SYNCS = re.compile(r"cuda(Stream|Device|Event)Synchronize|cudaMemcpy")
# Upper bounds (us) of the gap histogram's buckets.
GAP_BUCKETS = [(2, "< 2 us"), (10, "2-10 us"), (50, "10-50 us"), (200, "50-200 us"), (1000, "200 us-1 ms"),
               (math.inf, "> 1 ms")]
# Gaps shorter than this are the launch latency between back-to-back kernels: the host launches
# about as fast as the GPU finishes them (fewer, larger kernels or CUDA graphs remove them).
LAUNCH_BOUND_US = 10


def family(name):
    low = name.lower()
    for fam, pattern in FAMILIES:
        if re.search(pattern, low):
            return fam
    return "other"


def shorten(name, width=110):
    return name if len(name) < width else name[:width - 3] + "..."


def op_label(name):
    return name.replace("autograd::engine::evaluate_function: ", "bwd: ")


def end(e):
    return e["ts"] + e["dur"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--by-op", action="store_true", help="also sum kernel time by the launching CPU operator")
    ap.add_argument("--gaps", type=int, metavar="N", help="explain the main stream's idle gaps, listing the N largest")
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
    stream = main_stream(gpu)
    span = end(stream[-1]) - stream[0]["ts"]
    gaps = sum(gap_length(a, b) for a, b in idle_gaps(stream))
    idle = all_streams_idle(gpu)
    s = args.steps
    print(f"GPU busy per step {busy / s / 1000:.2f} ms over {len(gpu) // s} kernels; main stream span "
          f"{span / s / 1000:.2f} ms per step, idle gaps {gaps / s / 1000:.2f} ms ({100 * gaps / span:.1f}%); "
          f"no stream busy {idle / s / 1000:.2f} ms per step")
    print("| family | ms per step | share of GPU busy time |")
    print("| --- | --- | --- |")
    for fam, dur in by_family.most_common():
        print(f"| {fam} | {dur / s / 1000:.2f} | {100 * dur / busy:.1f}% |")
    print(f"\n| top {args.top} kernels | calls per step | ms per step | share |")
    print("| --- | --- | --- | --- |")
    for name, dur in by_name.most_common(args.top):
        print(f"| `{shorten(name)}` | {count[name] / s:.0f} | {dur / s / 1000:.3f} | {100 * dur / busy:.1f}% |")
    if not args.by_op and args.gaps is None:
        return
    timeline, calls = CpuTimeline(events), launch_calls(events)
    if args.by_op:
        print_by_op(timeline, calls, gpu, s, busy, args.top)
    if args.gaps is not None:
        gap_list = explain_gaps(events, stream, calls)
        print_gap_histogram(gap_list, s)
        print_largest_gaps(gap_list, args.gaps, timeline, calls, main_thread(events, calls), stream[0]["ts"])
        print_gap_causes(gap_list, s)


def main_stream(gpu):
    """The kernels of the stream with the most busy time, by start: the step's critical path."""
    per_stream = collections.defaultdict(list)
    for e in gpu:
        per_stream[(e.get("pid"), e.get("tid"))].append(e)
    return sorted(max(per_stream.values(), key=lambda v: sum(e["dur"] for e in v)), key=lambda e: e["ts"])


def all_streams_idle(gpu):
    """Time (us) between the first and the last GPU activity when no stream runs anything. The main
    stream's gaps overstate the GPU's idle time where work runs on side streams (the MoE experts'
    GEMMs on their 4 streams, communication) while the main stream waits for it."""
    idle, busy_until = 0.0, None
    for e in sorted(gpu, key=lambda e: e["ts"]):
        if busy_until is not None and e["ts"] > busy_until:
            idle += e["ts"] - busy_until
        busy_until = end(e) if busy_until is None else max(busy_until, end(e))
    return idle


def idle_gaps(stream):
    """(kernel before, kernel after) for each idle interval between consecutive kernels."""
    return [(a, b) for a, b in zip(stream, stream[1:]) if gap_length(a, b) > 0]


def gap_length(before, after):
    return after["ts"] - end(before)


class CpuTimeline:
    """Each CPU thread's operators (cpu_op and user_annotation events), to ask what a thread was
    running at a given time."""

    def __init__(self, events):
        self.ops = collections.defaultdict(list)
        for e in events:
            if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
                self.ops[e.get("tid")].append((e["ts"], end(e), e["name"]))
        self.tops = {}
        for tid, ops in self.ops.items():
            ops.sort(key=lambda o: (o[0], -o[1]))  # a parent before the children that start with it
            self.tops[tid] = []
            for o in ops:
                if not self.tops[tid] or o[0] >= self.tops[tid][-1][1]:
                    self.tops[tid].append(o)

    def running(self, tid, ts):
        """(outermost, innermost) operator running on thread tid at time ts, or None."""
        after_ts = (ts, math.inf)  # sorts after every operator that starts at or before ts
        tops = self.tops.get(tid, [])
        i = bisect.bisect_right(tops, after_ts) - 1
        if i < 0 or tops[i][1] < ts:
            return None
        outer = tops[i]
        # Operators nest, so the innermost one running is the latest to start that has not ended.
        ops = self.ops[tid]
        j = bisect.bisect_right(ops, after_ts) - 1
        while ops[j][1] < ts:
            j -= 1
        return op_label(outer[2]), op_label(ops[j][2])


def launch_calls(events):
    """The CUDA runtime/driver call that launched each GPU activity, by correlation id (the id the
    trace's ac2g flow arrows from the call to the kernel also carry)."""
    return {e["args"]["correlation"]: e for e in events
            if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})}


def launching_ops(timeline, calls, kernel):
    """(outermost, innermost) CPU operator around the call that launched kernel, or None."""
    call = calls.get(kernel.get("args", {}).get("correlation"))
    return call and timeline.running(call.get("tid"), call["ts"])


def print_by_op(timeline, calls, gpu, steps, busy, top):
    by_op = collections.Counter()
    n = collections.Counter()
    for e in gpu:
        if e.get("args", {}).get("correlation") not in calls:
            name = "(unattributed)"
        else:
            name = (launching_ops(timeline, calls, e) or ("(no operator)",))[0]
        by_op[name] += e["dur"]
        n[name] += 1
    print(f"\n| top {top} launching operators | kernels per step | ms per step | share |")
    print("| --- | --- | --- | --- |")
    for name, dur in by_op.most_common(top):
        print(f"| `{name[:100]}` | {n[name] / steps:.0f} | {dur / steps / 1000:.3f} | {100 * dur / busy:.1f}% |")


def main_thread(events, calls):
    """The thread running the training loop: the process's main thread (on Linux its id is the
    process id), else the thread that made the most launch calls."""
    tids = {e.get("tid") for e in events if e.get("cat") == "cpu_op" and e.get("tid") == e.get("pid")}
    if tids:
        return tids.pop()
    launches = collections.Counter(c.get("tid") for c in calls.values())
    return launches.most_common(1)[0][0] if launches else None


Gap = collections.namedtuple("Gap", "start length before after cause sync")


def explain_gaps(events, stream, calls):
    """Each idle gap of the stream with its cause and the host sync it waited on (or None)."""
    syncs = [e for e in events
             if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and HOST_SYNCS.fullmatch(e["name"])]
    gaps = []
    for before, after in idle_gaps(stream):
        start, stop = end(before), after["ts"]
        sync = starving_sync(syncs, start, stop, calls.get(after.get("args", {}).get("correlation")))
        length = stop - start
        cause = "after a host sync" if sync else "launch-bound" if length < LAUNCH_BOUND_US else "other"
        gaps.append(Gap(start, length, before, after, cause, sync))
    return gaps


def starving_sync(syncs, start, stop, next_launch):
    """A host sync running during the gap [start, stop) that returned before the call launching
    the next kernel began: that kernel waited for the sync. (A kernel launched before the sync was
    already queued; its gap is the GPU's, not the sync's.)"""
    for s in syncs:
        if s["ts"] < stop and end(s) > start and (next_launch is None or end(s) <= next_launch["ts"]):
            return s
    return None


def print_gap_histogram(gaps, steps):
    total = sum(g.length for g in gaps) or 1
    n, us = collections.Counter(), collections.Counter()
    for g in gaps:
        bucket = next(label for bound, label in GAP_BUCKETS if g.length < bound)
        n[bucket] += 1
        us[bucket] += g.length
    print("\n| main-stream idle gaps | gaps per step | ms per step | share of idle time |")
    print("| --- | --- | --- | --- |")
    for _, label in GAP_BUCKETS:
        print(f"| {label} | {n[label] / steps:.1f} | {us[label] / steps / 1000:.3f} | {100 * us[label] / total:.1f}% |")


def print_largest_gaps(gaps, n, timeline, calls, main_tid, origin):
    """The n longest gaps, each with the kernels around it and the operators that launched them,
    what the main thread was running when the GPU ran dry, and the host sync it waited on."""
    print(f"\n| largest {n} gaps | us | at ms | kernel before (launched by) | kernel after (launched by) "
          "| main thread at gap start | host sync it waited on |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for rank, g in enumerate(sorted(gaps, key=lambda g: -g.length)[:n], 1):
        sync = "-"
        if g.sync:
            sync = f"`{g.sync['name']}` in {ops_text(timeline.running(g.sync.get('tid'), g.sync['ts']))}"
        print(f"| {rank} | {g.length:.1f} | {(g.start - origin) / 1000:.3f} "
              f"| `{shorten(g.before['name'], 70)}` ({ops_text(launching_ops(timeline, calls, g.before))}) "
              f"| `{shorten(g.after['name'], 70)}` ({ops_text(launching_ops(timeline, calls, g.after))}) "
              f"| {ops_text(timeline.running(main_tid, g.start))} | {sync} |")


def ops_text(ops):
    """`outermost` / `innermost` operator, one name when they are the same, '-' for none."""
    if not ops:
        return "-"
    return f"`{ops[0]}`" if ops[0] == ops[1] else f"`{ops[0]}` / `{ops[1]}`"


def print_gap_causes(gaps, steps):
    us, n = collections.Counter(), collections.Counter()
    for g in gaps:
        us[g.cause] += g.length
        n[g.cause] += 1
    described = {"after a host sync": "after a host sync",
                 "launch-bound": f"launch-bound (gaps < {LAUNCH_BOUND_US} us)", "other": "other"}
    parts = [f"{text} {us[cause] / steps / 1000:.3f} ms in {n[cause] / steps:.1f} gaps"
             for cause, text in described.items()]
    print("\nIdle time per step by cause: " + "; ".join(parts))


if __name__ == "__main__":
    main()
