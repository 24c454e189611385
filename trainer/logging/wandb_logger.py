#!/usr/bin/env python3
"""fp8tron's Weights & Biases logger: the side process that owns the W&B run of a training run.

The trainer stays a native program without Python; with --wandb-project its W&B writer
(trainer/logging/wandb_writer.h) starts this script on the rank Megatron-LM logs W&B from and
feeds it over stdin, one JSON object per line:

  first  {"project": P, "name": N or null, "entity": E or null, "dir": D, "config": {...},
          "trainer_pid": PID, "program": PATH, "args": [...]}
  then   {"step": ITERATION, "name": "lm loss", "value": 2.5}    (NaN, Infinity as Python's json)
  last   {"finish": EXIT_CODE}

It answers once on the descriptor given by --status-fd: "ready <run directory>" after wandb.init,
or "error <what>: <message>". It lives exactly as long as its input: the end of the input without
a finish record means the trainer died, and the run is closed as failed.
"""
import argparse
import json
import os
import signal
import sys


def one_line(text):
    return " ".join(str(text).split())


def start_run(wandb, init):
    os.makedirs(init["dir"], exist_ok=True)
    # The run describes the trainer, not this script: its command line, and its process for the
    # system metrics W&B samples.
    sys.argv = [init["program"]] + init["args"]
    settings = wandb.Settings(x_stats_pid=init["trainer_pid"], program=init["program"], console="off",
                              root_dir=os.getcwd())
    kwargs = {"dir": init["dir"], "name": init["name"], "project": init["project"], "config": init["config"],
              "settings": settings}
    if init["entity"]:
        kwargs["entity"] = init["entity"]
    return wandb.init(**kwargs)


def log_records(run, lines):
    """Logs each record under its iteration; returns the exit code the run finishes with."""
    for line in lines:
        record = json.loads(line)
        if "finish" in record:
            return int(record["finish"])
        # One call per scalar, as Megatron's training_log: W&B merges the calls of one step.
        run.log({record["name"]: record["value"]}, step=record["step"])
    return 1


def main():
    parser = argparse.ArgumentParser(description="W&B side process of the fp8tron trainer (started by it)")
    parser.add_argument("--status-fd", type=int, required=True, help="descriptor the start-up answer goes to")
    args = parser.parse_args()
    # The trainer decides when the run ends: a terminal's interrupt or a scheduler's SIGTERM is for
    # the trainer, which may go on to save a checkpoint and log past it (--exit-signal-handler).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    status = os.fdopen(args.status_fd, "w")

    def answer(text):
        status.write(one_line(text) + "\n")
        status.flush()

    try:
        import wandb
    except ImportError as e:
        answer(f"error wandb-missing: {e}")
        return 1
    try:
        run = start_run(wandb, json.loads(sys.stdin.readline()))
    except Exception as e:  # wandb raises many kinds (usage, authentication, network, timeouts)
        answer(f"error wandb.init: {type(e).__name__}: {e}")
        return 1
    answer(f"ready {getattr(run.settings, 'sync_dir', None) or run.dir}")
    status.close()
    run.finish(exit_code=log_records(run, sys.stdin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
