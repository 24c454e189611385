#!/usr/bin/env python3
"""scripts/profile_summary.py --gaps on a synthetic PyTorch-profiler trace whose every gap, cause,
launching operator and main-thread operator is known by construction (the numbers below are
worked out by hand from the timeline in `step`, not computed by the script's own code).

    python3 tests/scripts/profile_summary/profile_summary_test.py"""
import json
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "profile_summary.py"
sys.path.insert(0, str(SCRIPT.parent))
import profile_summary  # noqa: E402

PID = 4242                # the process; its main thread has the same id (Linux)
MAIN, AUTOGRAD = PID, 4250  # the training loop's thread and the autograd engine's CUDA thread
STREAM, SIDE = 7, 13      # the busiest stream and a communication stream
BASE = 4614833312000.0    # profiler timestamps are large (us since boot); offsets stay exact
STEP2 = 2760              # step 2 starts 30 us after step 1's last kernel (a 10-50 us gap)
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"


class Trace:
    """Writes events the way the PyTorch profiler (kineto) does: cpu_op / user_annotation on CPU
    threads, a cuda_runtime call with a correlation id per launch, the GPU activity with the same
    id, and the ac2g flow arrow between them."""

    def __init__(self):
        self.events = [{"name": "thread_name", "ph": "M", "ts": BASE, "pid": PID, "tid": tid,
                        "args": {"name": f"thread {tid}"}} for tid in (MAIN, AUTOGRAD)]
        self.correlation = 0

    def op(self, name, start, stop, tid=MAIN, cat="cpu_op"):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": BASE + start,
                            "dur": stop - start, "args": {"External id": len(self.events)}})

    def runtime(self, name, start, stop, tid):
        self.correlation += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": BASE + start,
                            "dur": stop - start, "args": {"cbid": 211, "correlation": self.correlation}})
        return self.correlation

    def launch(self, name, call, start, stop, tid=MAIN, stream=STREAM, cat="kernel", api="cudaLaunchKernel"):
        c = self.runtime(api, call, call + 4, tid)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": BASE + start,
                            "dur": stop - start, "args": {"device": 0, "stream": stream, "correlation": c}})
        self.events.append({"ph": "s", "id": c, "pid": PID, "tid": tid, "ts": BASE + call, "cat": "ac2g",
                            "name": "ac2g"})
        self.events.append({"ph": "f", "id": c, "pid": 0, "tid": stream, "ts": BASE + start, "cat": "ac2g",
                            "name": "ac2g", "bp": "e"})


def step(t, o):
    """One training step at offset o (us). Gaps on STREAM, in order: 1, 5, 8, 6 (launch-bound),
    245 (after the loss.item() sync), 30, 100 (other), 3, 1.6 (launch-bound), 10 (other: not < 10),
    2, 1, 4 (launch-bound), 1650 (other: the optimizer's CPU time)."""
    # Forward on the main thread.
    t.op("aten::linear", o + 0, o + 60)
    t.op("aten::addmm", o + 5, o + 55)
    t.launch(GEMM, o + 10, o + 20, o + 120)
    t.op("aten::gelu", o + 60, o + 70)
    t.launch("vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", o + 62, o + 121, o + 141)
    t.op("aten::add", o + 70, o + 80)
    t.launch("vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", o + 72, o + 146, o + 156)
    t.op("aten::mul", o + 80, o + 90)
    t.launch("vectorized_elementwise_kernel<4, MulFunctor<float>>", o + 82, o + 164, o + 174)
    # loss.item(): the copy is queued before the sync, so its 6 us gap is not the sync's; the next
    # kernel is launched only after the sync returned: its 245 us gap is.
    t.op("aten::item", o + 100, o + 200)
    t.op("aten::_local_scalar_dense", o + 105, o + 198)
    t.launch("Memcpy DtoH (Device -> Pageable)", o + 108, o + 180, o + 185, cat="gpu_memcpy", api="cudaMemcpyAsync")
    t.runtime("cudaStreamSynchronize", o + 115, o + 190, MAIN)
    t.op("aten::mul", o + 420, o + 430)
    t.launch("vectorized_elementwise_kernel<4, MulFunctor<float>>", o + 422, o + 430, o + 480)
    # Backward on the autograd thread, which launches more kernels than the main thread.
    t.op("autograd::engine::evaluate_function: MmBackward0", o + 440, o + 560, AUTOGRAD)
    t.op("MmBackward0", o + 445, o + 555, AUTOGRAD)
    t.op("aten::mm", o + 450, o + 550, AUTOGRAD)
    t.launch(GEMM, o + 460, o + 510, o + 710, AUTOGRAD)
    t.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", o + 700, o + 770, AUTOGRAD)
    t.op("autograd::engine::evaluate_function: AddmmBackward0", o + 780, o + 830, AUTOGRAD)
    t.op("aten::mm", o + 790, o + 820, AUTOGRAD)
    t.launch(GEMM, o + 800, o + 810, o + 900, AUTOGRAD)
    t.op("autograd::engine::evaluate_function: NativeLayerNormBackward0", o + 835, o + 950, AUTOGRAD)
    t.op("aten::native_layer_norm_backward", o + 840, o + 945, AUTOGRAD)
    for i, (start, stop) in enumerate([(903, 913), (914.6, 920), (930, 940), (942, 1000), (1001, 1020), (1024, 1050)]):
        t.launch(f"layer_norm_grad_kernel_{i}", o + 850 + 5 * i, o + start, o + stop, AUTOGRAD)
    # A gradient all-reduce on another stream, inside the main stream's largest gap: it must
    # neither be the main stream nor split the gap.
    t.op("c10d::allreduce_", o + 1060, o + 1070, AUTOGRAD)
    t.launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", o + 1062, o + 1200, o + 1500, AUTOGRAD, stream=SIDE)
    # The optimizer's CPU work keeps the GPU waiting 1650 us.
    t.op("Optimizer.step#AdamW.step", o + 1000, o + 2755, cat="user_annotation")
    t.op("aten::_foreach_mul_", o + 1010, o + 2705)
    t.launch("multi_tensor_apply_kernel<AdamFunctor>", o + 2690, o + 2700, o + 2750)


def write_trace(path):
    t = Trace()
    step(t, 0)
    step(t, STEP2)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": t.events}))


class GapsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.trace = pathlib.Path(cls.dir.name) / "synthetic.pt.trace.json"
        write_trace(cls.trace)
        command = [sys.executable, str(SCRIPT), str(cls.trace), "--steps", "2", "--by-op", "--gaps", "3"]
        cls.out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        print(cls.out)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_every_gap_has_its_cause(self):
        events = json.loads(self.trace.read_text())["traceEvents"]
        gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
        stream = profile_summary.main_stream(gpu)
        self.assertEqual(stream[0]["tid"], STREAM)
        gaps = profile_summary.explain_gaps(events, stream, profile_summary.launch_calls(events))
        per_step = [(1, "launch-bound"), (5, "launch-bound"), (8, "launch-bound"), (6, "launch-bound"),
                    (245, "after a host sync"), (30, "other"), (100, "other"), (3, "launch-bound"),
                    (1.6, "launch-bound"), (10, "other"), (2, "launch-bound"), (1, "launch-bound"),
                    (4, "launch-bound"), (1650, "other")]
        expected = per_step + [(30, "other")] + per_step
        self.assertEqual([(round(g.length, 3), g.cause) for g in gaps], expected)

    def test_histogram_per_step(self):
        for row in ["| < 2 us | 3.0 | 0.004 |", "| 2-10 us | 6.0 | 0.028 |", "| 10-50 us | 2.5 | 0.055 |",
                    "| 50-200 us | 1.0 | 0.100 |", "| 200 us-1 ms | 1.0 | 0.245 |", "| > 1 ms | 1.0 | 1.650 |"]:
            self.assertIn(row, self.out)

    def test_largest_gaps_name_kernels_launchers_main_thread_and_sync(self):
        rows = [line for line in self.out.splitlines() if line.startswith(("| 1 |", "| 2 |", "| 3 |", "| 4 |"))]
        self.assertEqual(len(rows), 3)
        # The optimizer gap of step 1, at 1050 us, 1.030 ms after the first kernel (20 us).
        self.assertEqual(rows[0], "| 1 | 1650.0 | 1.030 | `layer_norm_grad_kernel_5` "
                         "(`bwd: NativeLayerNormBackward0` / `aten::native_layer_norm_backward`) "
                         "| `multi_tensor_apply_kernel<AdamFunctor>` "
                         "(`Optimizer.step#AdamW.step` / `aten::_foreach_mul_`) "
                         "| `Optimizer.step#AdamW.step` / `aten::_foreach_mul_` | - |")
        self.assertTrue(rows[1].startswith(f"| 2 | 1650.0 | {(STEP2 + 1030) / 1000:.3f} |"))
        self.assertEqual(rows[2], "| 3 | 245.0 | 0.165 | `Memcpy DtoH (Device -> Pageable)` "
                         "(`aten::item` / `aten::_local_scalar_dense`) "
                         "| `vectorized_elementwise_kernel<4, MulFunctor<float>>` (`aten::mul`) "
                         "| `aten::item` / `aten::_local_scalar_dense` "
                         "| `cudaStreamSynchronize` in `aten::item` / `aten::_local_scalar_dense` |")

    def test_main_thread_is_the_process_thread_not_the_busiest_launcher(self):
        events = json.loads(self.trace.read_text())["traceEvents"]
        self.assertEqual(profile_summary.main_thread(events, profile_summary.launch_calls(events)), MAIN)

    def test_running_operators_are_outermost_and_innermost_still_open(self):
        timeline = profile_summary.CpuTimeline(json.loads(self.trace.read_text())["traceEvents"])
        self.assertEqual(timeline.running(AUTOGRAD, BASE + 460), ("bwd: MmBackward0", "aten::mm"))
        # Step 1's optimizer step is still open after its _foreach_mul_ ended (at 2705).
        self.assertEqual(timeline.running(MAIN, BASE + 2750), ("Optimizer.step#AdamW.step",) * 2)
        self.assertIsNone(timeline.running(MAIN, BASE + 710))

    def test_causes_total(self):
        self.assertIn("Idle time per step by cause: after a host sync 0.245 ms in 1.0 gaps; launch-bound "
                      "(gaps < 10 us) 0.032 ms in 9.0 gaps; other 1.805 ms in 4.5 gaps", self.out)
        self.assertIn("idle gaps 2.08 ms", self.out)

    def test_idle_of_all_streams_leaves_out_side_stream_work(self):
        # The all-reduce's 300 us on SIDE fall inside the main stream's 1650 us gap of each step.
        self.assertIn("no stream busy 1.78 ms per step", self.out)

    def test_by_op_still_attributes_kernels_to_outermost_launching_operator(self):
        self.assertIn("| `aten::linear` | 1 | 0.100 |", self.out)
        self.assertIn("| `bwd: MmBackward0` | 1 | 0.200 |", self.out)
        self.assertIn("| `bwd: NativeLayerNormBackward0` | 6 |", self.out)


if __name__ == "__main__":
    unittest.main()
