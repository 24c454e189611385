"""torch._grouped_mm and torch._scaled_grouped_mm from Python, timed as bench_grouped_gemm.cpp
times them through ATen (same shapes, operands, token splits and timing), so the two programs'
torch rows can be compared: the C++ figures are torch's own kernels, not a LibTorch artefact.

eager: CUDA events around `iters` back-to-back calls after 3 warm-up calls;
graph: the call captured once in a CUDA graph (after 2 warm-up calls) and replayed the same way.
TFLOP/s = 2 * tokens * in * out. Usage: python3 bench_grouped_gemm_torch.py [iters]
"""
import sys

import torch

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
SHAPES = [(8, 4096, 2048, 5632), (8, 4096, 4096, 14336), (64, 1536, 2048, 1408)]


def eager_ms(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ITERS):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / ITERS


def graph_ms(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return eager_ms(graph.replay)


def both(flops, fn):
    try:
        return "%5.0f / %5.0f" % (flops / eager_ms(fn) / 1e9, flops / graph_ms(fn) / 1e9)
    except Exception as e:  # noqa: BLE001 - report and go on
        return "n/a (%s)" % str(e)[:60]


def main():
    dev = "cuda"
    print("[grouped-bench-py] %s, torch %s, CUDA %s, %d iterations per timing"
          % (torch.cuda.get_device_name(), torch.__version__, torch.version.cuda, ITERS))
    for experts, tokens, k, n in SHAPES:
        for skewed in (False, True):
            splits = [(tokens // 2 if e % 2 else tokens * 3 // 2) if skewed else tokens for e in range(experts)]
            m = sum(splits)
            flops = 2.0 * m * k * n
            torch.manual_seed(1)
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16) * 0.02
            x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            offs = torch.cumsum(torch.tensor(splits, device=dev, dtype=torch.int32), 0, dtype=torch.int32)
            sa, sb = torch.ones(m, device=dev), torch.ones(experts, n, device=dev)
            print("\n== %d x %d tokens%s, %d -> %d (M = %d)"
                  % (experts, tokens, " (skewed: alternately 1/2 and 3/2 x)" if skewed else "", k, n, m))
            print("   GEMM only, TFLOP/s eager / graph")
            print("   FP8   torch._scaled_grouped_mm        %s" % both(flops, lambda: torch._scaled_grouped_mm(
                x8, w8.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True)))
            print("   bf16  torch._grouped_mm               %s"
                  % both(flops, lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)))
            del x, w, x8, w8
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
