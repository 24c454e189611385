#!/usr/bin/env python3
"""Fault injection against the fp8tron binary on CPU (single process and mpirun): after every
fault, the last committed checkpoint must load and training must resume bitwise equal to an
uninterrupted run (same final weights, optimizer state, RNG states, counters: compared through
the checksums every checkpoint's metadata records for each stored tensor).

Faults: SIGKILL at every step of a save and its commit (sync and async; the hidden test flag
--fp8tron-test-kill-at), at retention's deletion, at random moments; one rank of an mpirun job
killed; one rank stopped (the hang report must name it within --hang-report-seconds); a full
disk (a small tmpfs, skipped where mounting is not permitted); flipped and truncated checkpoint
files; token ids outside the vocabulary; a second job on the same --save; a NaN loss; the rerun
engine (--rerun-mode validate_results, Megatron's default): a reproducible NaN (exit 16 with a
checkpoint, the restarted job's verdict on the same and on another node, exit 17), injected
transient and persistent errors under mpirun (every rank exits alike), a non-fatal rejection that
continues, and report_stats.

usage: fault_injection_test.py FP8TRON FP8TRON_PREPROCESS WORK_DIR [--quick]
       fault_injection_test.py FP8TRON FP8TRON_PREPROCESS WORK_DIR --nccl LAUNCH [--ranks N]
--nccl: the faults of a multi-rank job over NCCL instead, on this machine's GPUs (LAUNCH is
tests/parallel/nccl_launch.sh: with fewer GPUs than ranks the ranks share them), in --deterministic-mode so
that resumes compare bitwise: one rank of N (4 by default) killed, one stopped (reported, then
killed), and rank 0 stopped (the others must report it and end the job on their own after
--distributed-timeout-minutes). Exits 77 (skipped) where LAUNCH finds no GPU.
Prints one line per scenario and a report of counts; exits non-zero on any failure.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

FP8TRON, PREPROCESS, WORK = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
QUICK = "--quick" in sys.argv
NCCL_LAUNCH = sys.argv[sys.argv.index("--nccl") + 1] if "--nccl" in sys.argv else None
NCCL_RANKS = int(sys.argv[sys.argv.index("--ranks") + 1]) if "--ranks" in sys.argv else 4
MPIRUN = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
          "-x", "OMP_NUM_THREADS=1"]
ITERS = 12
# On GPUs, resumes compare bitwise only with deterministic kernels and NCCL's ring algorithm.
DEVICE = ["--device", "cuda", "--deterministic-mode"] if NCCL_LAUNCH else ["--device", "cpu"]
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--vocab-size", "128", "--builtin-data", "--micro-batch-size", "2",
         "--global-batch-size", "8", "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine",
         "--lr-warmup-iters", "2", "--train-iters", str(ITERS), "--log-interval", "1", "--eval-iters", "0",
         "--save-interval", "2", "--seed", "7"] + DEVICE
DP2 = ["--use-distributed-optimizer"]
# A job too long to end on its own while a test stops or kills one of its ranks: at ~7 ms an
# iteration, the 12-iteration job can finish between the log line the test waits for and the
# signal (it did on a loaded 2-core CI machine), and then nothing is tested.
LONG = ["--train-iters", "100000"]
# A mixture-of-experts run: 4 experts over 2 expert-parallel ranks (each rank holds 2), the first
# layer dense; the experts' gradients and optimizer state are their own optimizer domain.
MOE_EP2 = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "([0]+[1])",
           "--moe-aux-loss-coeff", "1e-2", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]

counts = {"faults injected": 0, "resumes checked": 0, "clear errors checked": 0, "skipped": 0, "failures": 0}
losses = []


def log(msg):
    print(msg, flush=True)


def fail(scenario, msg):
    counts["failures"] += 1
    log(f"FAIL {scenario}: {msg}")


def command(args, ranks=1):
    if ranks > 1:
        launcher = [NCCL_LAUNCH, "mpirun", str(ranks)] if NCCL_LAUNCH else MPIRUN + ["-np", str(ranks)]
    else:
        launcher = []
    return launcher + [FP8TRON] + MODEL + args


def run(args, ranks=1, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(command(args, ranks), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env, start_new_session=True, errors="surrogateescape")
    return p.returncode, p.stdout


def start(args, ranks=1):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = open(os.path.join(WORK, "background.log"), "w+")
    p = subprocess.Popen(command(args, ranks), stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    return p, out


def where_ranks_wait(pids, skip):
    """What each rank's threads are doing (for a report that did not come): their kernel wait
    channels, and their stacks where gdb is installed."""
    lines = []
    for rank, pid in sorted(pids.items()):
        if rank == skip:
            continue
        try:
            tasks = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
            waits = [f"{open(f'/proc/{pid}/task/{t}/comm').read().strip()}:"
                     f"{open(f'/proc/{pid}/task/{t}/wchan').read().strip() or '-'}" for t in tasks]
        except OSError:
            continue
        lines.append(f"rank {rank} (pid {pid}) threads: " + " ".join(waits))
        if shutil.which("gdb"):
            bt = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt 12"],
                                capture_output=True, text=True, timeout=60).stdout
            lines += [l for l in bt.splitlines() if l.startswith(("Thread ", "#"))]
    return "\n".join(lines)


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def wait_for(out, pattern, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out.seek(0)
        text = out.read()
        if re.search(pattern, text):
            return text
        time.sleep(0.1)
    out.seek(0)
    return None


def text_of(out):
    out.seek(0)
    return out.read()


def fresh(name):
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def final_state(save_dir, iteration=ITERS):
    """What must be bitwise equal between two runs: every stored tensor's checksum, the RNG
    states and the counters of the checkpoint of `iteration`."""
    meta = json.load(open(os.path.join(save_dir, f"iter_{iteration:07d}", "fp8tron_checkpoint.json")))
    tensors = {name: sorted((s["file"], s["key"], tuple(s["offset"]), s["xxh3_64"]) for s in t["shards"])
               for name, t in meta["tensors"].items()}
    return {"tensors": tensors, "rng": meta["rng"], "samples": meta["consumed_train_samples"],
            "scheduler": meta["lr_scheduler"]["num_steps"], "scaler": meta["loss_scaler"]}


def last_loss(output, iteration=ITERS):
    found = re.findall(r"iteration\s+%d/\s*\d+ \|.*?lm loss: ([0-9.E+-]+)" % iteration, output)
    return found[-1] if found else None


REFERENCE = {}


def reference(ranks, model=()):
    """The uninterrupted run with `ranks` ranks and the extra model flags `model` (e.g. MOE_EP2)."""
    key = (ranks, tuple(model))
    if key not in REFERENCE:
        d = fresh(f"reference_{ranks}" + ("_moe" if model else ""))
        rc, out = run(["--save", d] + (DP2 if ranks > 1 else []) + list(model), ranks)
        if rc != 0:
            raise SystemExit(f"the uninterrupted reference run ({ranks} ranks {' '.join(model)}) failed:\n{out[-3000:]}")
        REFERENCE[key] = (final_state(d), last_loss(out), d)
    return REFERENCE[key]


def tracker(save_dir):
    path = os.path.join(save_dir, "latest_checkpointed_iteration.txt")
    return open(path).read().strip() if os.path.exists(path) else None


def check_resume(scenario, save_dir, ranks=1, extra=(), model=()):
    """Resumes from whatever `save_dir` holds and compares the end with the uninterrupted run."""
    want, want_loss, _ = reference(ranks, model)
    resume_and_compare(scenario, save_dir, (DP2 if ranks > 1 else []) + list(model) + list(extra), ranks, want, want_loss,
                       ITERS, f"resumed from iteration {tracker_before.get(save_dir) or '0 (none saved)'}")


tracker_before = {}


def check_long_resume(scenario, save_dir, ranks):
    """Resumes a LONG job until four iterations past its last checkpoint (--exit-interval saves
    there) and compares with an uninterrupted LONG run that exits at the same iteration."""
    saved = int(tracker(save_dir) or 0)
    if saved >= 1000:
        return fail(scenario, f"the job ran to iteration {saved} before its rank was signalled")
    stop = saved + 4
    args = DP2 + LONG + ["--exit-interval", str(stop)]
    ref = fresh(f"long_reference_{stop}")
    rc, out = run(["--save", ref] + args, ranks)
    if rc != 0:
        return fail(scenario, f"the uninterrupted run to iteration {stop} failed (exit {rc}):\n{out[-2000:]}")
    resume_and_compare(scenario, save_dir, args, ranks, final_state(ref, stop), last_loss(out, stop), stop,
                       f"resumed from iteration {saved or '0 (none saved)'} to {stop}")


def resume_and_compare(scenario, save_dir, args, ranks, want, want_loss, iteration, resumed):
    rc, out = run(["--load", save_dir, "--save", save_dir] + list(args), ranks)
    if rc != 0:
        return fail(scenario, f"resume failed (exit {rc}):\n{out[-2000:]}")
    got = final_state(save_dir, iteration)
    if got != want:
        differing = [k for k in want if got.get(k) != want[k]]
        return fail(scenario, f"resumed run differs from the uninterrupted one in {differing}")
    counts["resumes checked"] += 1
    losses.append(last_loss(out, iteration))
    log(f"ok   {scenario}: {resumed}, final state bitwise equal (last loss {last_loss(out, iteration)} = {want_loss})")


def killed_at(scenario, args, ranks=1, save_dir=None, model=()):
    """Runs until a SIGKILL; checks the tracker names a complete checkpoint; resumes."""
    rc, out = run(args + list(model), ranks)
    counts["faults injected"] += 1
    if rc == 0:
        return fail(scenario, "the run was not killed")
    if "test fault point" not in out and "SIGKILL" not in out and rc not in (-9, 137):
        return fail(scenario, f"exit {rc} without the fault:\n{out[-1500:]}")
    t = tracker(save_dir)
    tracker_before[save_dir] = t
    if t is not None and not os.path.exists(os.path.join(save_dir, f"iter_{int(t):07d}", "fp8tron_checkpoint.json")) \
            and not any(n.startswith(f"iter_{int(t):07d}.old.") for n in os.listdir(save_dir)):
        return fail(scenario, f"the tracker names iteration {t}, which is not complete")
    check_resume(scenario, save_dir, ranks, model=model)


def kill_points():
    points = ["save:shard-written", "save:metadata-written", "commit:files-verified", "commit:files-synced",
              "commit:renamed-into-place", "commit:tracker-temp-written", "commit:tracker-committed",
              "commit:cleaned-up"]
    for mode in (["sync"], ["async"]) if not QUICK else (["sync"],):
        for point in points:
            d = fresh("kill")
            flags = ["--save", d, "--fp8tron-test-kill-at", f"{point}@2"] + (["--async-save"] if mode == ["async"] else [])
            killed_at(f"SIGKILL at {point} ({mode[0]} save)", flags, save_dir=d)
    # Re-saving an iteration moves the old copy aside first: a kill right then.
    d = fresh("resave")
    run(["--save", d, "--exit-interval", "6"])
    killed_at("SIGKILL at commit:old-copy-moved-aside (re-saving iteration 6)",
              ["--load", d, "--ckpt-step", "4", "--save", d, "--fp8tron-test-kill-at", "commit:old-copy-moved-aside"],
              save_dir=d)
    # Retention deletes by renaming aside first: a kill between the rename and the removal.
    for point in ("retention:renamed-aside", "retention:removed"):
        d = fresh("retain")
        killed_at(f"SIGKILL at {point}", ["--save", d, "--save-retain-interval", "4",
                                          "--fp8tron-test-kill-at", point], save_dir=d)
        listed = sorted(n for n in os.listdir(d) if re.fullmatch(r"iter_\d{7}", n))
        for n in listed:
            if not os.path.exists(os.path.join(d, n, "fp8tron_checkpoint.json")):
                fail(point, f"{n} is listed but incomplete")
    # Under mpirun: rank 1's shard write, then rank 0's tracker commit.
    for point in ("save:shard-written", "commit:tracker-temp-written"):
        d = fresh("kill_mpi")
        killed_at(f"SIGKILL at {point} (mpirun, 2 ranks, distributed optimizer)",
                  ["--save", d, "--fp8tron-test-kill-at", f"{point}@2"] + DP2, ranks=2, save_dir=d)


def random_kills(n):
    rng = random.Random(1234)
    for i in range(n):
        d = fresh("random")
        extra = ["--async-save"] if i % 2 else []
        p, out = start(["--save", d] + extra)
        at = rng.randrange(1, ITERS)  # a random iteration, and a random moment in it
        if not wait_for(out, r"iteration\s+%d/" % at, 60):
            kill_group(p)
            fail("random kill", "the run did not reach iteration %d" % at)
            continue
        time.sleep(rng.uniform(0.0, 0.02))
        kill_group(p)
        counts["faults injected"] += 1
        tracker_before[d] = tracker(d)
        check_resume(f"SIGKILL at a random moment of iteration {at}{' (async saves)' if extra else ''}", d)


def mpi_rank_pids(mpirun_pid):
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != mpirun_pid:
                continue
            env = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
            for kv in env:
                if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                    pids[int(kv.split(b"=")[1])] = int(entry)
        except (OSError, ValueError):
            pass
    return pids


def start_job(scenario, save_dir, flags, iteration, ranks):
    """Starts a LONG job of `ranks` ranks; once it has logged `iteration`, returns (mpirun, log,
    pids by rank), or None after a failure."""
    p, out = start(["--save", save_dir] + flags + DP2 + LONG, ranks=ranks)
    if not wait_for(out, r"iteration\s+%d/" % iteration, 240):
        kill_group(p)
        return fail(scenario, f"the job did not reach iteration {iteration}:\n{text_of(out)[-1500:]}")
    pids = mpi_rank_pids(p.pid)
    if sorted(pids) != list(range(ranks)):
        kill_group(p)
        return fail(scenario, f"not every rank's process found (children: {pids})")
    return p, out, pids


def kill_one_rank(ranks=2, victim=1):
    scenario = f"SIGKILL of rank {victim} of a {ranks}-rank mpirun job" + (" (NCCL)" if NCCL_LAUNCH else "")
    d = fresh(f"rank_kill_{ranks}")
    job = start_job(scenario, d, [], 5, ranks)
    if not job:
        return
    p, _, pids = job
    os.kill(pids[victim], signal.SIGKILL)
    killed = time.time()
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        kill_group(p)
        return fail(scenario, f"mpirun did not end the job after rank {victim} died")
    ended = time.time() - killed
    rc = p.returncode
    kill_group(p)
    kill_ranks_and_wait(list(pids.values()))
    counts["faults injected"] += 1
    if rc == 0:
        return fail(scenario, "the job exited 0 after one of its ranks was killed")
    log(f"ok   {scenario}: the job ended {ended:.0f} s later, exit {rc}")
    tracker_before[d] = tracker(d)
    check_long_resume(scenario, d, ranks)


def kill_ranks_and_wait(pids, timeout=60):
    """SIGKILLs the ranks themselves and waits until each has exited (or is a zombie, its files
    closed): a rank outliving mpirun still holds the save directory's lock, and a resume started
    before it is gone is refused."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + timeout
    for pid in pids:
        while time.time() < deadline:
            try:
                state = open(f"/proc/{pid}/stat").read()
            except OSError:
                break
            if state[state.rindex(")") + 2] == "Z":
                break
            time.sleep(0.2)


HANG_PARTS = (r"on group '[^']+' \(global ranks [0-9,]+\)", r"Last finished iteration per rank: 0:[0-9?]+ 1:[0-9?]+")


def stopped_rank_is_reported(ranks=2, victim=1, report_after=5):
    """A stopped rank is named by the ranks that wait for it, within --hang-report-seconds."""
    scenario = f"rank {victim} of {ranks} stopped (SIGSTOP)" + (" (NCCL)" if NCCL_LAUNCH else "")
    d = fresh(f"hang_{ranks}")
    job = start_job(scenario, d, ["--hang-report-seconds", str(report_after), "--distributed-timeout-minutes", "2"], 3,
                    ranks)
    if not job:
        return
    p, out, pids = job
    os.kill(pids[victim], signal.SIGSTOP)
    stopped = time.time()
    text = wait_for(out, r"collective hang: .*", report_after + 25)
    took = time.time() - stopped
    waits = "" if text else where_ranks_wait(pids, victim)
    kill_group(p)
    kill_ranks_and_wait(list(pids.values()))
    counts["faults injected"] += 1
    if not text:
        return fail(scenario, f"no hang report within {report_after + 25} s; the job's output ends:\n"
                              f"{text_of(out)[-3000:]}\n{waits}")
    line = re.search(r"collective hang: .*", text).group(0)
    for part in HANG_PARTS + (rf"not arrived: (rank \d+ \([^)]*\), )*rank {victim} \(last finished iteration \d+",
                              r"no heartbeat for \d+ s: stopped or dead"):
        if not re.search(part, line):
            return fail(scenario, f"the report lacks /{part}/: {line}")
    counts["clear errors checked"] += 1
    log(f"ok   {scenario}: reported after {took:.0f} s: {line[:200]}...")
    tracker_before[d] = tracker(d)
    check_long_resume(f"resume after the job with a stopped rank {victim} was killed", d, ranks)


def stopped_host_rank_ends_the_job(ranks=2, report_after=5):
    """Rank 0 stopped: it hosts the side channel under mpirun, so the others' reports must not wait on
    it; they say so, and the job ends on its own, non-zero, after --distributed-timeout-minutes."""
    scenario = f"rank 0 of {ranks} stopped (SIGSTOP)" + (" (NCCL)" if NCCL_LAUNCH else "")
    d = fresh(f"hang_host_{ranks}")
    job = start_job(scenario, d, ["--hang-report-seconds", str(report_after), "--distributed-timeout-minutes", "1"], 3,
                    ranks)
    if not job:
        return
    p, out, pids = job
    os.kill(pids[0], signal.SIGSTOP)
    stopped = time.time()
    text = wait_for(out, r"collective hang: .*", report_after + 30)
    took = time.time() - stopped
    try:
        p.wait(timeout=60 + 45 - (time.time() - stopped))
        ended, rc = time.time() - stopped, p.returncode
    except (subprocess.TimeoutExpired, ValueError):
        ended, rc = None, None
    kill_group(p)
    kill_ranks_and_wait(list(pids.values()))
    counts["faults injected"] += 1
    if not text:
        return fail(scenario, f"no hang report within {report_after + 30} s")
    line = re.search(r"collective hang: .*", text).group(0)
    for part in HANG_PARTS[:1] + (r"the side channel did not answer within", r"rank 0 is stopped or dead"):
        if not re.search(part, line):
            return fail(scenario, f"the report lacks /{part}/: {line}")
    if ended is None:
        return fail(scenario, "the job did not end within 45 s after its 1-minute --distributed-timeout-minutes")
    if rc == 0 or not re.search(r"timed out after 1 min \(--distributed-timeout-minutes\)", text_of(out)):
        return fail(scenario, f"expected a timeout error and a non-zero exit, got exit {rc}")
    # The timeout's line repeats the report with its moment, so that its times do not read as stale.
    if not NCCL_LAUNCH and not re.search(r"timed out after 1 min .*; at the report after \d+ s, collective hang: .* "
                                         r"has waited \d+ s on rank", text_of(out)):
        return fail(scenario, f"the timeout's line does not date the report it repeats:\n{text_of(out)[-1500:]}")
    counts["clear errors checked"] += 1
    log(f"ok   {scenario}: reported after {took:.0f} s ({line[:160]}...); the job ended {ended:.0f} s after the stop, "
        f"exit {rc}")
    tracker_before[d] = tracker(d)
    check_long_resume(f"resume after the job with a stopped rank 0 timed out", d, ranks)


def full_disk():
    _, _, ref_dir = reference(1)
    size = sum(os.path.getsize(os.path.join(ref_dir, "iter_0000002", f)) for f in os.listdir(os.path.join(ref_dir, "iter_0000002")))
    d = fresh("full_disk")
    pages = (int(size * 1.6) // 4096 + 2) * 4096
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={pages}", "tmpfs", d], capture_output=True, text=True)
    if mounted.returncode != 0:
        counts["skipped"] += 1
        return log(f"SKIP full disk: cannot mount a {pages}-byte tmpfs here ({mounted.stderr.strip() or 'mount failed'}); "
                   f"run as root with mount permission to test it")
    try:
        rc, out = run(["--save", d])
        counts["faults injected"] += 1
        if rc == 0 or "disk full (ENOSPC)" not in out:
            return fail("full disk", f"expected a 'disk full' error, got exit {rc}:\n{out[-1500:]}")
        counts["clear errors checked"] += 1
        log("ok   full disk: " + re.search(r"fp8tron: error: .*", out).group(0)[:200])
        t = tracker(d)
        roomy = fresh("full_disk_roomy")
        for entry in os.listdir(d):
            src = os.path.join(d, entry)
            if entry.startswith("iter_") and "." not in entry:
                shutil.copytree(src, os.path.join(roomy, entry))
            elif entry == "latest_checkpointed_iteration.txt":
                shutil.copy(src, roomy)
        tracker_before[roomy] = t
        check_resume("resume after a full disk", roomy)
    finally:
        subprocess.run(["umount", d], capture_output=True)


def corrupt_and_fall_back():
    _, _, ref_dir = reference(1)

    def copy_of(name):
        d = fresh(name)
        for it in (8, 10):
            shutil.copytree(os.path.join(ref_dir, f"iter_{it:07d}"), os.path.join(d, f"iter_{it:07d}"))
        open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w").write("10")
        return d

    def expect_error(scenario, d, pattern):
        rc, out = run(["--load", d, "--save", d])
        counts["faults injected"] += 1
        if rc == 0 or not re.search(pattern, out):
            return fail(scenario, f"expected /{pattern}/, got exit {rc}:\n{out[-1500:]}")
        line = re.search(r"fp8tron: error: .*", out).group(0)
        if re.search(r"[^\x20-\x7e]", line):
            return fail(scenario, f"the error prints raw bytes: {line!r}")
        counts["clear errors checked"] += 1
        log(f"ok   {scenario}: " + line[:220])
        tracker_before[d] = "8 (--ckpt-step 8)"
        check_resume(f"{scenario}: the previous checkpoint", d, extra=["--ckpt-step", "8"])

    d = copy_of("flipped")
    shard = os.path.join(d, "iter_0000010", "rank_00000.safetensors")
    data = bytearray(open(shard, "rb").read())
    for i in range(len(data) - 4096, len(data) - 4088):
        data[i] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    # Every refusal of a damaged checkpoint names what else --ckpt-step can load.
    others = r".*; load another complete iteration with --ckpt-step N \(complete iterations: 8\)"
    expect_error("8 flipped bytes in a shard", d, r"is corrupt: in .*rank_00000\.safetensors, tensor '[^']+'" + others)

    d = copy_of("truncated")
    shard = os.path.join(d, "iter_0000010", "rank_00000.safetensors")
    data = open(shard, "rb").read()
    open(shard, "wb").write(data[: len(data) // 2])
    expect_error("a truncated shard", d, r"rank_00000\.safetensors" + others)

    d = copy_of("truncated_metadata")
    meta = os.path.join(d, "iter_0000010", "fp8tron_checkpoint.json")
    text = open(meta).read()
    open(meta, "w").write(text[: len(text) // 3])
    expect_error("a truncated metadata file", d, r"not valid JSON" + others)

    # Binary garbage prints escaped and bounded, never as raw bytes.
    d = copy_of("binary_metadata")
    open(os.path.join(d, "iter_0000010", "fp8tron_checkpoint.json"), "wb").write(bytes(range(200, 256)) * 4)
    expect_error("binary bytes in the metadata file", d, r"not valid JSON .*last read: '\\xc8.*" + others)
    d = copy_of("binary_shard")
    shard = os.path.join(d, "iter_0000010", "rank_00000.safetensors")
    data = bytearray(open(shard, "rb").read())
    data[8:72] = bytes(range(192, 256))
    open(shard, "wb").write(bytes(data))
    expect_error("binary bytes in a shard's header", d, r"its header starts with '(\\x[0-9a-f]{2}){10}\.\.\.', not '\{'" + others)

    # An iteration directory that is not one: a file, a dangling link.
    d = copy_of("iteration_is_a_file")
    shutil.rmtree(os.path.join(d, "iter_0000010"))
    open(os.path.join(d, "iter_0000010"), "w").write("x")
    expect_error("an iteration directory that is a file", d,
                 r"names iteration 10 but \S+iter_0000010 is a file, not a checkpoint directory" + others)
    d = copy_of("dangling_link")
    shutil.rmtree(os.path.join(d, "iter_0000010"))
    os.symlink(os.path.join(d, "gone"), os.path.join(d, "iter_0000010"))
    expect_error("an iteration directory that is a dangling link", d,
                 r"iter_0000010 is a symbolic link to \S+gone, which does not exist" + others)

    # Unreadable: as a user the files are not open to (root reads everything, so the run drops to nobody).
    for scenario, victim, pattern in [
            ("an unreadable iteration directory", "iter_0000010",
             r"iter_0000010 cannot be read \(permission denied\): give this user read and search permission"),
            ("an unreadable shard", "iter_0000010/rank_00000.safetensors",
             r"could not read \S+rank_00000\.safetensors: permission denied while opening it")]:
        d = copy_of("unreadable")
        for root, dirs, files in os.walk(d):
            for n in dirs + files:
                os.chmod(os.path.join(root, n), 0o777 if n in dirs else 0o666)
        os.chmod(os.path.join(d, victim), 0)
        as_nobody = (lambda: (os.setgid(65534), os.setuid(65534))) if os.geteuid() == 0 else None
        p = subprocess.run(command(["--load", d]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"), preexec_fn=as_nobody,
                           errors="surrogateescape")
        os.chmod(os.path.join(d, victim), 0o777)
        counts["faults injected"] += 1
        line = re.search(r"fp8tron: error: .*", p.stdout)
        if p.returncode != 1 or not line or not re.search(pattern + others, line.group(0)) or "save elsewhere" in line.group(0):
            fail(scenario, f"expected /{pattern}/ (and no advice to save), got exit {p.returncode}:\n{p.stdout[-1500:]}")
        else:
            counts["clear errors checked"] += 1
            log(f"ok   {scenario}: " + line.group(0)[:220])


BAD_TOKEN = (r"token id 700 in train sample \d+ \(position \d+; dataset .*corpus_text_document, document 17, "
             r"token 9 of it\) is outside the vocabulary of 128 tokens")


def bad_token_corpus(check_broken=False):
    """A corpus whose document 17 holds token 700 (tokenized with another tokenizer), preprocessed;
    returns the flags that train on it. With check_broken, first checks that a failing preprocess
    (a malformed line) leaves nothing behind."""
    d = fresh("bad_tokens")
    corpus = os.path.join(d, "corpus.jsonl")
    rng = random.Random(5)
    with open(corpus, "w") as f:
        for doc in range(60):
            ids = [rng.randrange(100) for _ in range(40)]
            if doc == 17:
                ids[9] = 700  # tokenized with another tokenizer
            f.write(json.dumps({"text": " ".join(map(str, ids))}) + "\n")
    preprocess = [PREPROCESS, "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--append-eod"]
    if check_broken:
        broken = os.path.join(d, "broken.jsonl")
        open(broken, "w").write(open(corpus).read() + "{not json\n")
        p = subprocess.run(preprocess + ["--input", broken, "--output-prefix", os.path.join(d, "broken")],
                           capture_output=True, text=True, timeout=240)
        counts["faults injected"] += 1
        left = [n for n in os.listdir(d) if n.startswith("broken_")]
        if p.returncode == 0 or left:
            fail("failing preprocess", f"exit {p.returncode}, left behind: {left}")
        else:
            counts["clear errors checked"] += 1
            log("ok   a failing fp8tron-preprocess leaves no output: " + p.stderr.strip().splitlines()[-1][:160])
    p = subprocess.run(preprocess + ["--input", corpus, "--output-prefix", os.path.join(d, "corpus")],
                       capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        fail("bad token ids", "preprocess failed: " + p.stderr[-500:])
        return None
    return [a for a in MODEL if a != "--builtin-data"] + [
        "--data-path", os.path.join(d, "corpus_text_document"), "--tokenizer-type", "NullTokenizer",
        "--split", "100,0,0", "--data-cache-path", os.path.join(d, "cache")]


def bad_token_ids():
    args = bad_token_corpus(check_broken=True)
    if args is None:
        return
    out = subprocess.run([FP8TRON] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    counts["faults injected"] += 1
    if out.returncode == 0 or not re.search(BAD_TOKEN, out.stdout) or "Traceback" in out.stdout or "internal error" in out.stdout:
        return fail("bad token ids", f"exit {out.returncode}:\n{out.stdout[-1500:]}")
    counts["clear errors checked"] += 1
    log("ok   token id outside the vocabulary: " + re.search(r"fp8tron: error: .*", out.stdout).group(0)[:200])
    bad_token_on_one_rank(args, MPIRUN + ["-np", "2"])


def bad_token_on_one_rank(args, launcher):
    """Only the rank that reads the sample fails: the job ends at once with its line, not when the
    other rank's collective times out. The same with the combined 1F1B schedule, where the sample
    is read in the forward pass that runs beside another micro-batch's backward (one micro-batch
    each: sample 50 is rank 0's second of iteration 7): that backward must stop too, not issue its
    all-to-alls alone."""
    combined = ["--micro-batch-size", "1", "--bf16", "--overlap-moe-expert-parallel-comm"] + MOE_EP2
    for scenario, extra in (("on one rank of two", DP2), ("inside a combined 1F1B pair (MoE, EP2)", combined)):
        started = time.time()
        p = subprocess.run(launcher + [FP8TRON] + args + ["--distributed-timeout-minutes", "2"] + extra,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240,
                           start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        rc, text, took = p.returncode, p.stdout, time.time() - started
        counts["faults injected"] += 1
        if rc != 1 or not re.search(BAD_TOKEN, text) or took > 60:
            fail(f"bad token ids {scenario}", f"exit {rc} after {took:.0f} s:\n{text[-1500:]}")
            continue
        counts["clear errors checked"] += 1
        log(f"ok   token id outside the vocabulary {scenario}: the job ended after {took:.0f} s, exit {rc}")


def second_job():
    # Long enough that the first job is still running when it is stopped after its 2nd iteration
    # (12 iterations can end within the 0.1 s wait_for polls, and then there is no lock to test).
    longer = ["--train-iters", "200", "--save-interval", "50"]
    d = fresh("second_job")
    p, out = start(["--save", d] + longer)
    if not wait_for(out, r"iteration\s+2/", 60):
        kill_group(p)
        return fail("second job", "the first job did not start")
    os.killpg(p.pid, signal.SIGSTOP)  # the first job holds the lock while the second starts
    rc, text = run(["--save", d])
    os.killpg(p.pid, signal.SIGCONT)
    counts["faults injected"] += 1
    if rc == 0 or not re.search(r"--save .* is in use by another fp8tron job \(host=\S+ pid=\d+", text):
        kill_group(p)
        return fail("second job", f"not refused (exit {rc}):\n{text[-1500:]}")
    counts["clear errors checked"] += 1
    log("ok   a second job on the same --save: " + re.search(r"fp8tron: error: .*", text).group(0)[:200])
    p.wait(timeout=240)
    undisturbed = fresh("second_job_reference")
    rc, _ = run(["--save", undisturbed] + longer)
    if p.returncode != 0 or rc != 0 or final_state(d, 200) != final_state(undisturbed, 200):
        return fail("second job", "the first job was disturbed")
    counts["resumes checked"] += 1
    log("ok   the first job finished undisturbed, bitwise equal to the uninterrupted run")


def foreign_save_dir():
    """A run that did not resume from --save never writes into it: neither a new run beside a
    finished one (it would move the tracker back) nor a run whose --load lost its tracker (it
    would start from random and overwrite the checkpoints)."""
    _, _, finished = reference(1)
    held = sorted(x for x in os.listdir(finished) if x.startswith("iter_"))
    cases = [("a new run into a finished run's --save", ["--save", finished, "--train-iters", "3"],
              r"--save .* holds the checkpoints of another run \(iterations [0-9, ]+\) that this run would overwrite "
              r"from scratch; resume it with --load")]
    d = fresh("lost_tracker")
    shutil.copytree(finished, d, dirs_exist_ok=True)
    os.remove(os.path.join(d, "latest_checkpointed_iteration.txt"))
    cases.append(("--load and --save of a directory whose tracker is lost", ["--load", d, "--save", d],
                  r"holds the checkpoints of another run .*; resume one with --ckpt-step N"))
    for scenario, args, pattern in cases:
        before = {x: tracker(x) for x in (finished, d)}
        rc, out = run(args)
        counts["faults injected"] += 1
        after = {x: tracker(x) for x in (finished, d)}
        now = sorted(x for x in os.listdir(finished) if x.startswith("iter_"))
        if rc != 1 or not re.search(pattern, out) or after != before or now != held:
            fail(scenario, f"exit {rc}, trackers {before} -> {after}, checkpoints {held} -> {now}:\n{out[-1500:]}")
            continue
        counts["clear errors checked"] += 1
        log(f"ok   {scenario} refused, nothing written: " + re.search(r"fp8tron: error: .*", out).group(0)[:150])


def nan_loss():
    """--rerun-mode disabled: the first result is judged, the run stops (exit 1)."""
    d = fresh("nan")
    rc, out = run(["--save", d, "--fp8tron-test-inject-nan", "7", "--rerun-mode", "disabled"])
    counts["faults injected"] += 1
    if rc != 1 or not re.search(r"iteration 7: the loss is NaN.*stopping, as --check-for-nan-in-loss-and-grad asks", out):
        return fail("NaN loss", f"exit {rc}:\n{out[-1500:]}")
    if tracker(d) != "6":
        return fail("NaN loss", f"tracker names {tracker(d)}, not 6")
    counts["clear errors checked"] += 1
    log("ok   NaN loss at iteration 7: " + re.search(r"fp8tron: error: .*", out).group(0)[:160])
    tracker_before[d] = "6"
    check_resume("resume after the NaN stop", d, extra=["--rerun-mode", "disabled"])


def moe_faults():
    """Mixture of experts under mpirun (2 ranks, expert parallel 2, distributed optimizer): a kill
    inside a save, and a NaN in one expert's gradient, which only rank 1 holds: the run stops
    naming that expert, and the last good checkpoint resumes bitwise equal."""
    d = fresh("moe_kill")
    killed_at("SIGKILL at commit:files-synced (MoE, expert parallel 2, mpirun)",
              ["--save", d, "--fp8tron-test-kill-at", "commit:files-synced@2"] + DP2, ranks=2, save_dir=d, model=MOE_EP2)
    d = fresh("moe_nan")
    expert = "decoder.layers.1.mlp.experts.linear_fc1.weight3"
    rc, out = run(["--save", d, "--rerun-mode", "disabled", "--fp8tron-test-inject-nan", f"7:{expert}"] + DP2 + MOE_EP2,
                  ranks=2)
    counts["faults injected"] += 1
    want = r"iteration 7: the gradient norm is NaN \(the first parameter whose gradient is not finite: %s\)" % re.escape(expert)
    if rc == 0 or not re.search(want, out):
        return fail("NaN in an expert's gradient", f"exit {rc}:\n{out[-1500:]}")
    if tracker(d) != "6":
        return fail("NaN in an expert's gradient", f"tracker names {tracker(d)}, not 6")
    counts["clear errors checked"] += 1
    log("ok   NaN in an expert's gradient (rank 1) at iteration 7: " + re.search(r"fp8tron: error: .*", out).group(0)[:160])
    tracker_before[d] = "6"
    check_resume("resume after the expert NaN stop (MoE)", d, ranks=2, model=MOE_EP2, extra=["--rerun-mode", "disabled"])


def expect_exit(scenario, rc, out, status, pattern, ranks=1):
    """The run ended with `status` and every rank's last line matches `pattern`."""
    counts["faults injected"] += 1
    ends = re.findall(r"fp8tron: (iteration .*)", out)
    if rc != status or len(ends) != ranks or not all(re.search(pattern, e) for e in ends):
        fail(scenario, f"expected exit {status} on {ranks} rank(s) with /{pattern}/, got exit {rc}:\n{out[-2500:]}")
        return False
    counts["clear errors checked"] += 1
    log(f"ok   {scenario}: exit {rc}: {ends[0][:170]}")
    return True


def rerun_engine():
    """Megatron's rerun engine (--rerun-mode validate_results, the default)."""
    # A NaN reproduced in place: the state before the iteration is saved (the checkpoint of
    # iteration 6, with the request to re-run 7 elsewhere), exit 16. Restarted on the same node:
    # exit 16 again; elsewhere: the NaN again, a correct result of the model and data, exit 17.
    d = fresh("rerun_nan")
    rc, out = run(["--save", d, "--fp8tron-test-inject-nan", "7"])
    if not expect_exit("reproducible NaN (validate_results)", rc, out, 16,
                       r"iteration 7: .* is reproducible when the iteration runs again on the same hardware; saved the "
                       r"checkpoint of iteration 6"):
        return
    if tracker(d) != "6":
        return fail("reproducible NaN", f"tracker names {tracker(d)}, not 6")
    rc, out = run(["--load", d, "--save", d, "--fp8tron-test-inject-nan", "7"])
    expect_exit("restarted on the same node", rc, out, 16, r"a rank runs on the same node and GPU")
    rc, out = run(["--load", d, "--save", d, "--fp8tron-test-inject-nan", "7", "--fp8tron-test-node-name", "elsewhere"])
    expect_exit("restarted on another node", rc, out, 17, r"is reproducible on other hardware as well")
    # The saved state is the one before iteration 7: resumed without the NaN (the request ignored
    # with --rerun-mode disabled), the run ends as the uninterrupted one.
    tracker_before[d] = "6"
    check_resume("resume from the rerun checkpoint", d, extra=["--rerun-mode", "disabled"])

    # Retention never retires the checkpoint from before the fault: with --save-retain-interval the
    # fault's checkpoint (iteration 7) would count as the newer good one and delete iteration 6,
    # the healthy run's last, leaving nothing to go back to on this machine.
    d = fresh("rerun_retention")
    rc, out = run(["--save", d, "--save-retain-interval", "100", "--fp8tron-test-inject-nan", "8"])
    if expect_exit("reproducible NaN with --save-retain-interval", rc, out, 16,
                   r"saved the checkpoint of iteration 7.*The last checkpoint from before the fault is iteration 6: "
                   r"to go on here, resume it with --ckpt-step 6"):
        kept = sorted(x for x in os.listdir(d) if x.startswith("iter_"))
        if kept != ["iter_0000006", "iter_0000007"] or tracker(d) != "7":
            fail("retention after a fault", f"checkpoints {kept}, tracker {tracker(d)}: want iterations 6 and 7, tracker 7")
        else:
            rc, out = run(["--load", d, "--ckpt-step", "6", "--save", fresh("rerun_retention_resumed"),
                           "--rerun-mode", "disabled"])
            if rc != 0 or last_loss(out) != reference(1)[1]:
                fail("resume the checkpoint kept from before the fault", f"exit {rc}:\n{out[-1500:]}")
            else:
                counts["resumes checked"] += 1
                log("ok   retention kept iteration 6 beside the fault's checkpoint 7; --ckpt-step 6 resumed to the "
                    "reference's last loss")

    # Injected errors under mpirun (data parallel 2, distributed optimizer): every rank decides alike.
    d = fresh("rerun_transient")
    rc, out = run(["--save", d, "--error-injection-rate", "20"] + DP2, ranks=2)
    if expect_exit("injected transient error (mpirun 2 ranks)", rc, out, 17,
                   r"could not be reproduced by running the iteration again in place: a transient fault", ranks=2):
        if "Possible transient error!!" not in out:
            fail("injected transient error", "Megatron's 'Possible transient error!!' line is missing")
        tracker_before[d] = tracker(d)
        check_resume("resume after the transient error (mpirun 2 ranks)", d, ranks=2)
    d = fresh("rerun_persistent")
    persistent = ["--save", d, "--error-injection-rate", "1", "--error-injection-type", "persistent_error"] + DP2
    rc, out = run(persistent, ranks=2)
    if expect_exit("injected persistent error (mpirun 2 ranks)", rc, out, 16, r"saved the checkpoint of iteration 1",
                   ranks=2):
        rc, out = run(persistent + ["--load", d, "--fp8tron-test-node-name", "elsewhere"], ranks=2)
        expect_exit("persistent error, restarted on another node", rc, out, 17,
                    r"a persistent fault of the hardware that computed it \(rank 0 on node ", ranks=2)
        tracker_before[d] = "1"
        check_resume("resume from the persistent error's checkpoint (mpirun 2 ranks)", d, ranks=2,
                     extra=["--rerun-mode", "disabled"])

    # A non-fatal rejection (an injected correct result on the spiky-loss check): the iteration runs
    # again and the run continues, ending as the run without it.
    d = fresh("rerun_continue")
    rc, out = run(["--save", d, "--no-check-for-nan-in-loss-and-grad", "--check-for-spiky-loss",
                   "--error-injection-rate", "1", "--error-injection-type", "correct_result"] + DP2, ranks=2)
    counts["faults injected"] += 1
    if rc != 0 or "Continuing normal execution because failed validation was not fatal" not in out:
        fail("non-fatal rejection", f"exit {rc}:\n{out[-2000:]}")
    elif final_state(d) != reference(2)[0]:
        fail("non-fatal rejection", "the run with a re-run in place differs from the uninterrupted one")
    else:
        counts["resumes checked"] += 1
        log("ok   a non-fatal rejection re-ran its iteration in place (mpirun 2 ranks); the final state is bitwise "
            "the uninterrupted run's")

    # report_stats: every iteration twice; on the CPU every difference is zero.
    d = fresh("rerun_stats")
    rc, out = run(["--save", d, "--rerun-mode", "report_stats"])
    calls = re.findall(r"From validation call '(.*)':", out)
    summaries = re.findall(r"^ {4}(\S.*(?:samples, all identical|rel\. variability.*))$", out, re.M)
    if rc != 0 or not calls or len(summaries) != len(calls) or any("rel. variability" in x for x in summaries):
        fail("report_stats", f"exit {rc}, calls {calls}, summaries {summaries}:\n{out[-2000:]}")
    elif final_state(d) != reference(1)[0]:
        fail("report_stats", "the run differs from the uninterrupted one")
    else:
        counts["resumes checked"] += 1
        log(f"ok   report_stats: '{calls[-1]}': {summaries[-1]}; final state bitwise the uninterrupted run's")


def nccl_faults(only=None):
    """The faults of a multi-rank job over NCCL (the rest of the suite is about files and flags,
    the same on every device); `only`: the names of a few of them."""
    if subprocess.run([NCCL_LAUNCH, "mpirun", "1", "true"], capture_output=True).returncode == 77:
        log("skipped: no GPU on this machine")
        sys.exit(77)
    scenarios = {
        "kill_one_rank": lambda: kill_one_rank(NCCL_RANKS, victim=1),
        "stopped_rank_is_reported": lambda: stopped_rank_is_reported(NCCL_RANKS, victim=1, report_after=20),
        "stopped_host_rank_ends_the_job": lambda: stopped_host_rank_ends_the_job(NCCL_RANKS, report_after=20),
        "bad_token_on_one_rank": nccl_bad_token_on_one_rank,
    }
    for name in only or scenarios:
        scenarios[name]()


def nccl_bad_token_on_one_rank():
    args = bad_token_corpus()
    if args is not None:
        bad_token_on_one_rank(args, [NCCL_LAUNCH, "mpirun", "2"])


def report_and_exit(start_time):
    log("fault injection report: " + ", ".join(f"{v} {k}" for k, v in counts.items()) +
        f"; {len(losses)} resumed runs ended with the reference's last loss; {time.time() - start_time:.0f} s")
    sys.exit(1 if counts["failures"] else 0)


def main():
    os.makedirs(WORK, exist_ok=True)
    start_time = time.time()
    # e.g. --only corrupt_and_fall_back,second_job: a few scenarios while working on them
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    if NCCL_LAUNCH:
        nccl_faults(only)
        report_and_exit(start_time)
    if only:
        for name in only:
            globals()[name]()
        report_and_exit(start_time)
    reference(1)
    reference(2)
    kill_points()
    random_kills(2 if QUICK else 4)
    kill_one_rank()
    stopped_rank_is_reported()
    stopped_host_rank_ends_the_job()
    full_disk()
    corrupt_and_fall_back()
    bad_token_ids()
    second_job()
    foreign_save_dir()
    nan_loss()
    rerun_engine()
    moe_faults()
    report_and_exit(start_time)


if __name__ == "__main__":
    main()
