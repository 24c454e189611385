#!/usr/bin/env python3
"""Weights & Biases logging end to end, on the CPU and offline.

  offline_run   trains the tiny GPT with WANDB_MODE=offline, reads the run back with the wandb
                package (`wandb leet inspect --json`) and checks every iteration's scalars against
                the iteration lines the trainer printed, the validation losses, the config and the
                run's end.
  start_errors  a Python that cannot run, or has no wandb package: one error line before training.
  logger_dies   a logger that exits mid-run: the run finishes, with one warning.
  last_rank     two ranks under mpirun: only the last one starts a logger, and it gets every step.

usage: wandb_test.py CASE FP8TRON WANDB_PYTHON [MPIRUN]
The fake loggers are shell scripts standing in for the Python interpreter: the trainer starts
them as `<python> wandb_logger.py --status-fd 3`, and they answer on descriptor 3 as the real one.
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
        "--lr-warmup-iters", "2", "--vocab-size", "64", "--builtin-data", "--device", "cpu", "--log-interval", "1",
        "--eval-iters", "1", "--eval-interval", "3"]

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def close(a, b, rel):
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel)


def run(cmd, env_extra, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def iteration_lines(stdout):
    """Each printed iteration line's fields, by iteration."""
    lines = {}
    for line in stdout.splitlines():
        m = re.search(r"iteration +(\d+)/ *\d+ \|(.*)", line)
        if not m:
            continue
        fields = {}
        for part in m.group(2).split("|"):
            if ":" in part:
                key, value = part.rsplit(":", 1)
                fields[key.strip()] = float(value)
        lines[int(m.group(1))] = fields
    return lines


def validation_losses(stdout):
    return {int(it): float(v) for it, v in re.findall(r"validation loss at iteration (\d+) \| lm loss value: (\S+)", stdout)}


def fake_logger(directory, body):
    """A stand-in for the Python interpreter running wandb_logger.py."""
    path = os.path.join(directory, "fake_python")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)
    return path


def read_offline_run(python, run_dir):
    """The run's records, as the wandb package reads its transaction log."""
    out = subprocess.run([python, "-m", "wandb", "leet", "inspect", "--json", run_dir], capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        sys.exit(f"FAIL: `wandb leet inspect` could not read {run_dir}: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def offline_run(fp8tron, python, work):
    save = os.path.join(work, "wandb-files")
    result = run([fp8tron, *TINY, "--train-iters", "6", "--log-throughput", "--log-timers-to-tensorboard",
                  "--timing-log-level", "1", "--wandb-project", "fp8tron-tests", "--wandb-exp-name", "tiny-offline",
                  "--wandb-save-dir", save],
                 {"WANDB_MODE": "offline", "FP8TRON_WANDB_PYTHON": python, "WANDB_SILENT": "true"})
    check(result.returncode == 0, f"the run exits 0 (got {result.returncode}: {result.stderr.strip()[-400:]})")
    check("WARNING: W&B" not in result.stderr, "no W&B warning")
    printed = iteration_lines(result.stdout)
    check(sorted(printed) == list(range(1, 7)), "six iteration lines printed")
    runs = [d for d in os.listdir(os.path.join(save, "wandb")) if d.startswith("offline-run-")] \
        if os.path.isdir(os.path.join(save, "wandb")) else []
    check(len(runs) == 1, f"one offline run under --wandb-save-dir/wandb (found {runs})")
    if not runs:
        return
    records = read_offline_run(python, os.path.join(save, "wandb", runs[0]))
    history = {}
    for r in records:
        if r["type"] == "history":
            history.setdefault(r["history"]["step"].get("num", 0), {}).update(r["history"]["item"])
    check(sorted(history) == list(range(1, 7)), f"history steps are the iterations 1..6 (got {sorted(history)})")
    for it, line in printed.items():
        row = history.get(it, {})
        check(close(row.get("lm loss", math.nan), line["lm loss"], 1e-6),
              f"iteration {it}: lm loss {row.get('lm loss')} = printed {line['lm loss']}")
        check(close(row.get("learning-rate", math.nan), line["learning rate"], 1e-6),
              f"iteration {it}: learning-rate {row.get('learning-rate')} = printed {line['learning rate']}")
        check(row.get("batch-size") == line["global batch size"], f"iteration {it}: batch-size {row.get('batch-size')}")
        check(row.get("samples vs steps") == line["consumed samples"], f"iteration {it}: samples vs steps")
        check(abs(row.get("grad-norm", math.nan) - line["grad norm"]) <= 6e-4, f"iteration {it}: grad-norm")
        check(row.get("loss-scale") == line["loss scale"], f"iteration {it}: loss-scale")
        check(close(row.get("throughput", math.nan), line["throughput per GPU (TFLOP/s/GPU)"], 0.06),
              f"iteration {it}: throughput")
        check(row.get("iteration-time", 0) > 0 and row.get("forward-backward-time", 0) > 0,
              f"iteration {it}: iteration-time and the timers (--log-timers-to-tensorboard)")
        check(not any(k.endswith(" vs samples") for k in row), f"iteration {it}: no TensorBoard 'vs samples' twins")
    validation = validation_losses(result.stdout)
    check(sorted(validation) == [3, 6], f"validation printed at 3 and 6 (got {sorted(validation)})")
    for it, loss in validation.items():
        logged = history.get(it, {}).get("lm loss validation", math.nan)
        check(close(logged, loss, 1e-6), f"iteration {it}: lm loss validation {logged} = printed {loss}")
    run_record = next((r["run"] for r in records if r["type"] == "run"), {})
    check(run_record.get("project") == "fp8tron-tests" and run_record.get("display_name") == "tiny-offline",
          "the run's project and name are --wandb-project and --wandb-exp-name")
    config = run_record.get("config", {}).get("update", {})
    expected = {"hidden_size": 32, "num_layers": 2, "lr": 1e-3, "train_iters": 6, "micro_batch_size": 2,
                "global_batch_size": 4, "builtin_data": True, "bf16": False, "wandb_project": "fp8tron-tests",
                "save": None, "world_size": 1, "data_parallel_size": 1, "slurm_job_name": "N/A"}
    for key, value in expected.items():
        check(config.get(key) == value, f"config {key} = {value!r} (got {config.get(key)!r})")
    environment = next((r["environment"] for r in records if r["type"] == "environment" and "program" in r["environment"]), {})
    check(environment.get("program", "").endswith("fp8tron") and "--wandb-project" in environment.get("args", []),
          "the run's command is the trainer's")
    exits = [r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit"]
    check(exits == [0], f"the run finished with exit code 0 (got {exits})")


def start_errors(fp8tron, python, work):
    flags = [*TINY, "--train-iters", "3", "--wandb-project", "p", "--wandb-save-dir", os.path.join(work, "w")]
    no_site = fake_logger(work, f'exec "{python}" -S "$@"\n')  # the same Python without its packages
    cases = [("/nonexistent/python3", "cannot be run"), (no_site, "the wandb package is not installed")]
    for interpreter, text in cases:
        result = run([fp8tron, *flags], {"WANDB_MODE": "offline", "FP8TRON_WANDB_PYTHON": interpreter})
        lines = result.stderr.strip().splitlines()
        check(result.returncode == 1, f"{interpreter}: exit status 1 (got {result.returncode})")
        check(len(lines) == 1 and lines[0].startswith("fp8tron: error: --wandb-project:") and text in lines[0] and
              "scripts/setup.sh" in lines[0], f"{interpreter}: one error line naming the fix (got {lines})")
        check("training ..." not in result.stdout.splitlines(), f"{interpreter}: stops before training")
    result = run([fp8tron, *TINY, "--train-iters", "3", "--wandb-project", "p"], {"FP8TRON_WANDB_PYTHON": python})
    check(result.returncode == 1 and "give --wandb-save-dir, or --save" in result.stderr,
          "--wandb-project without a directory is refused naming --wandb-save-dir and --save")


def logger_dies(fp8tron, python, work):
    # Answers, takes the run's start and three records, then fails. The trainer sees it when a write
    # finds the pipe closed (or, had every record fitted in the pipe first, from its exit status).
    fake = fake_logger(work, 'echo "ready $PWD" >&3\nexec 3>&-\nhead -n 4 >/dev/null\nexit 1\n')
    result = run([fp8tron, *TINY, "--train-iters", "30", "--wandb-project", "p", "--wandb-save-dir",
                  os.path.join(work, "w")], {"FP8TRON_WANDB_PYTHON": fake})
    check(result.returncode == 0, f"the run finishes (exit {result.returncode}: {result.stderr.strip()[-300:]})")
    check(sorted(iteration_lines(result.stdout)) == list(range(1, 31)), "every iteration line printed")
    warnings = [l for l in result.stderr.splitlines() if "W&B" in l]
    check(len(warnings) == 1 and "logger process" in warnings[0] and "exited with status 1" in warnings[0],
          f"one warning (got {warnings})")


def last_rank(fp8tron, python, work, mpirun):
    records = os.path.join(work, "records")
    fake = fake_logger(work, f'echo "ready $PWD" >&3\nexec 3>&-\necho "$OMPI_COMM_WORLD_RANK" >>"{work}/ranks"\n'
                             f'cat >"{records}"\n')
    result = run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", "-x",
                  "OMP_NUM_THREADS=1", "-x",
                  f"FP8TRON_WANDB_PYTHON={fake}", fp8tron, *TINY, "--train-iters", "4", "--wandb-project", "p",
                  "--wandb-save-dir", os.path.join(work, "w")], {}, timeout=600)
    check(result.returncode == 0, f"the 2-rank run exits 0 (got {result.returncode}: {result.stderr.strip()[-300:]})")
    ranks = open(os.path.join(work, "ranks")).read().split() if os.path.exists(os.path.join(work, "ranks")) else []
    check(ranks == ["1"], f"one logger, on the last rank (started on ranks {ranks})")
    lines = open(records).read().splitlines() if os.path.exists(records) else []
    init = json.loads(lines[0]) if lines else {}
    check(init.get("config", {}).get("world_size") == 2, "the run's config says world_size 2")
    logged = {}
    for line in lines[1:]:
        r = json.loads(line)
        if r.get("name") == "lm loss":
            logged[r["step"]] = r["value"]
    printed = {it: f["lm loss"] for it, f in iteration_lines(result.stdout).items()}
    check(sorted(logged) == [1, 2, 3, 4] and all(close(logged[i], printed.get(i, math.nan), 1e-6) for i in logged),
          f"the last rank logs the printed lm loss of every iteration ({logged} vs {printed})")
    check(lines[-1:] == ['{"finish":0}'], "the run is closed as finished")


def main():
    case, fp8tron, python = sys.argv[1:4]
    if case != "start_errors" and subprocess.run([python, "-c", "import wandb"], capture_output=True).returncode != 0:
        sys.exit(f"FAIL: the wandb package is not installed for {python}: run scripts/setup.sh")
    with tempfile.TemporaryDirectory(prefix="fp8tron_wandb_") as work:
        if case == "offline_run":
            offline_run(fp8tron, python, work)
        elif case == "start_errors":
            start_errors(fp8tron, python, work)
        elif case == "logger_dies":
            logger_dies(fp8tron, python, work)
        elif case == "last_rank":
            last_rank(fp8tron, python, work, sys.argv[4])
        else:
            sys.exit(f"unknown case {case}")
    print(f"{case}: {len(failures)} failed" if failures else f"{case}: all passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
