#!/usr/bin/env python3
"""Draws the real-text FP8 convergence runs of scripts/text_corpus/fp8_convergence.sh.

  plot_convergence.py RUN_DIR OUT_PREFIX [TITLE]

RUN_DIR holds <recipe>.log (and tb/<recipe>/ when the TensorBoard package is installed). Writes
OUT_PREFIX_loss.png (validation loss of every recipe; each FP8 recipe's training loss relative to
bf16's, averaged over 500 iterations, with the 0.25% band) and, from the TensorBoard event files,
OUT_PREFIX_casts.png (the share of non-zero gradient values that each recipe's casts round to
zero, over every FP8 linear). Prints the table of final validation losses.
"""
import collections
import glob
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["bf16", "delayed", "tensorwise", "delayed-e4m3", "tensorwise-e4m3", "blockwise", "mxfp8", "hif8"]
LABELS = {"bf16": "bf16", "delayed": "delayed, hybrid", "tensorwise": "tensorwise, hybrid",
          "delayed-e4m3": "delayed, e4m3", "tensorwise-e4m3": "tensorwise, e4m3",
          "blockwise": "blockwise, e4m3", "mxfp8": "MXFP8, hybrid", "hif8": "tensorwise, HiF8"}
TRAIN = re.compile(r"\] iteration\s+(\d+)/.*?lm loss: ([0-9.E+-]+)")
VALID = re.compile(r"validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+)")


def read_log(path):
    train, valid = {}, {}
    for line in open(path, encoding="utf-8", errors="replace"):
        if m := TRAIN.search(line):
            train[int(m[1])] = float(m[2])
        elif m := VALID.search(line):
            valid[int(m[1])] = float(m[2])
    return train, valid


def moving_mean(values, window):
    windows = (values[max(0, i - window + 1):i + 1] for i in range(len(values)))
    return [sum(w) / len(w) for w in windows]


def plot_losses(runs, out, title):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    base_train = runs["bf16"][0]
    for name, (train, valid) in runs.items():
        steps = sorted(valid)
        top.plot(steps, [valid[s] for s in steps], marker=".", label=LABELS.get(name, name),
                 linewidth=2 if name == "bf16" else 1, color="black" if name == "bf16" else None)
        if name == "bf16":
            continue
        common = [s for s in sorted(train) if s in base_train]
        rel = [100 * (train[s] - base_train[s]) / base_train[s] for s in common]
        bottom.plot(common, moving_mean(rel, 10), label=LABELS.get(name, name))
    top.set_ylabel("validation loss")
    top.set_ylim(top=min(5.0, top.get_ylim()[1]))
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    bottom.axhspan(-0.25, 0.25, color="green", alpha=0.1, label="within 0.25%")
    bottom.axhline(0, color="black", linewidth=1)
    bottom.set_ylabel("training loss vs bf16, % (mean of 500 its)")
    bottom.set_xlabel("iteration")
    bottom.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def gradient_underflow_share(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    totals = collections.defaultdict(lambda: [0.0, 0.0])
    for tag in acc.Tags()["scalars"]:
        if not (tag.startswith("fp8/") and "/grad_output/" in tag):
            continue
        kind = tag.rsplit("/", 1)[1]
        if kind not in ("underflows", "elements"):
            continue
        for event in acc.Scalars(tag):
            totals[event.step][0 if kind == "underflows" else 1] += event.value
    steps = sorted(s for s, (_, n) in totals.items() if n > 0)
    return steps, [100 * totals[s][0] / totals[s][1] for s in steps]


def plot_casts(run_dir, names, out):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        print("no TensorBoard package: the cast statistics are not drawn (pip install tensorboard)")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for name in names:
        tb = os.path.join(run_dir, "tb", name)
        if name == "bf16" or not os.path.isdir(tb):
            continue
        steps, share = gradient_underflow_share(tb)
        ax.plot(steps, share, label=LABELS.get(name, name))
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylabel("gradients rounded to zero, % of non-zero")
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    run_dir, prefix = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) == 4 else "GPT-2 124M, real text (packaged documentation), 8 x 1024 tokens per step"
    found = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(run_dir, "*.log"))}
    if "bf16" not in found:
        raise SystemExit(f"{run_dir}: no bf16.log, the baseline every recipe is compared with")
    names = [n for n in ORDER if n in found] + sorted(found - set(ORDER))
    runs = {n: read_log(os.path.join(run_dir, n + ".log")) for n in names}
    plot_losses(runs, prefix + "_loss.png", title)
    plot_casts(run_dir, names, prefix + "_casts.png")
    base_valid = runs["bf16"][1]
    last = max(base_valid)
    print(f"| recipe | validation loss at {last} | vs bf16 | training loss at its last log | vs bf16 |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        train, valid = runs[name]
        end = max(train)
        base_t = runs["bf16"][0][end]
        v = f"{valid[last]:.4f} | {100 * (valid[last] - base_valid[last]) / base_valid[last]:+.2f}%" \
            if last in valid else "not reached |"
        print(f"| {LABELS.get(name, name)} | {v} | {train[end]:.4f} (it {end}) | {100 * (train[end] - base_t) / base_t:+.2f}% |")


if __name__ == "__main__":
    main()
