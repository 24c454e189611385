#!/usr/bin/env python3
"""How many of Megatron-LM's own GPT and MoE test configurations fp8tron accepts.

Reads every tests/functional_tests/test_cases/{gpt,moe}/*/model_config.yaml of a Megatron-LM
checkout, turns its MODEL_ARGS into flags (data paths filled with the test data that
tests/cli/megatron_configs/test_data.sh makes), runs `fp8tron --dry-run` with an 8-rank world (the
size Megatron's CI runs them at) and prints one line per configuration, the refusals counted by the
flag they name, and the share accepted. Configurations of other entry points than pretrain_gpt.py
(text generation, RL, distillation) are not counted.

With --megatron-check, each refused configuration also goes through Megatron-LM's own argument
checks (scripts/megatron_validate_args.py, on the CPU; MEGATRON_DIR must then be a checkout whose
Python imports): those Megatron refuses too are told apart, and the share is also given of the
configurations Megatron accepts.

usage: scripts/megatron_config_coverage.py MEGATRON_DIR [--build build] [--list] [--megatron-check]
"""
import argparse
import collections
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
# What Megatron's CI substitutes in the configs, and what our test data provides in its place.
PLACEHOLDERS = ("DATA_PATH", "VOCAB_FILE", "MERGE_FILE", "TOKENIZER_MODEL", "CHECKPOINT_SAVE_PATH",
                "CHECKPOINT_LOAD_PATH", "TENSORBOARD_PATH", "DATA_CACHE_PATH", "WANDB_SAVE_PATH",
                "WANDB_EXPERIMENT", "TP_COMM_OVERLAP_CFG")


def make_test_data(build: pathlib.Path, work: pathlib.Path) -> dict:
    """Runs test_data.sh in a shell and returns the placeholders it exports."""
    script = (f"WORK={shlex.quote(str(work))} MAKE={build}/tests/cli/fp8tron_make_megatron_test_data "
              f"PRE={build}/fp8tron-preprocess; source {ROOT}/tests/cli/megatron_configs/test_data.sh; env -0")
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True).stdout.decode()
    env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    values = {k: env[k] for k in PLACEHOLDERS if k in env}
    values["REPEAT"] = "1"  # the repetition number of a repeated test, its seed
    return values


# The flags whose value is a path under one of Megatron's data placeholders, and the test file that
# takes its place (Megatron's CI keeps its corpora and tokenizers in subfolders of DATA_PATH).
PATH_FLAGS = {"--data-path": "DATA_PATH", "--vocab-file": "VOCAB_FILE", "--merge-file": "MERGE_FILE",
              "--tokenizer-model": "TOKENIZER_MODEL", "--load": "CHECKPOINT_LOAD_PATH",
              "--save": "CHECKPOINT_SAVE_PATH"}
# Entry points other than pretrain_gpt.py: text generation, RL (GRPO), distillation and export.
OTHER_SCRIPTS = ("--output-path", "--prompt-file", "--export-kd-cfg", "--grpo-")


def flags_of(model_args: dict, values: dict) -> list:
    """MODEL_ARGS as command-line words: true is a bare switch, false drops the flag."""
    words = []
    for flag, value in model_args.items():
        if value is False or value is None:
            continue
        words.append(flag)
        if value is True:
            continue
        text = str(value)
        if flag in PATH_FLAGS and "$" in text and PATH_FLAGS[flag] in values:
            words.append(values[PATH_FLAGS[flag]])
            continue
        text = re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), text)
        # Megatron's launcher (tests/functional_tests/shell_test_utils/_run_training.sh): a value in
        # brackets is its words without the brackets, one in parentheses or with spaces is one word.
        if re.fullmatch(r"\[[^]]+\]", text):
            words.extend(text[1:-1].split())
        else:
            words.append(text)
    return words


def refusal_of(output: str) -> str:
    """The flag a refusal names: the first --flag of the error line or the "not supported" list."""
    lines = [l for l in output.splitlines() if "error" in l.lower()]
    if "not supported yet" in output:
        lines = output.split("not supported yet", 1)[1].splitlines()[:3] + lines
    for line in lines:
        m = re.search(r"--[a-z0-9][a-z0-9-]*", line)
        if m:
            return m.group(0)
    return (lines[0] if lines else output.strip().splitlines()[-1] if output.strip() else "no output")[:100]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("megatron", type=pathlib.Path)
    p.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    p.add_argument("--list", action="store_true", help="print every configuration's outcome")
    p.add_argument("--megatron-check", action="store_true",
                   help="run each refused configuration through Megatron-LM's own argument checks")
    a = p.parse_args()
    cases = sorted(a.megatron.glob("tests/functional_tests/test_cases/gpt/*/model_config.yaml")) + \
        sorted(a.megatron.glob("tests/functional_tests/test_cases/moe/*/model_config.yaml"))
    if not cases:
        sys.exit(f"error: no tests/functional_tests/test_cases/{{gpt,moe}}/*/model_config.yaml under {a.megatron}")
    binary = a.build.resolve() / "fp8tron"
    accepted, refused, skipped, megatron_refuses = [], collections.Counter(), [], []
    with tempfile.TemporaryDirectory() as tmp:
        values = make_test_data(a.build.resolve(), pathlib.Path(tmp))
        for case in cases:
            name = f"{case.parent.parent.name}/{case.parent.name}"
            config = yaml.safe_load(case.read_text()) or {}
            model_args = config.get("MODEL_ARGS")
            if not model_args or "inference" in name or any(f.startswith(OTHER_SCRIPTS) for f in model_args):
                skipped.append(name)
                continue
            env = dict(os.environ, WORLD_SIZE="8", **values)
            # From Megatron's root, as its CI runs them: some name files of its test tree.
            run = subprocess.run([str(binary), *flags_of(model_args, values), "--dry-run"], env=env, cwd=a.megatron,
                                 capture_output=True, text=True, timeout=300)
            out = run.stdout + run.stderr
            if run.returncode == 0 and "dry run: configuration is valid" in out:
                accepted.append(name)
                outcome = "accepted"
            else:
                why = refusal_of(out)
                refused[why] += 1
                outcome = f"refused: {why}"
                if a.megatron_check:
                    # With the configuration's ENV_VARS, as Megatron's launcher exports them.
                    config_env = {k: str(v).lower() if isinstance(v, bool) else str(v)
                                  for k, v in (config.get("ENV_VARS") or {}).items()}
                    verdict = megatron_verdict(a.megatron, flags_of(model_args, values), {**env, **config_env})
                    outcome += f" (Megatron {verdict})"
                    if verdict.startswith("refuses"):
                        megatron_refuses.append(name)
            if a.list:
                print(f"{name}: {outcome}")
    total = len(accepted) + sum(refused.values())
    print(f"\n{len(accepted)} of {total} accepted ({100.0 * len(accepted) / max(total, 1):.1f}%); "
          f"{len(skipped)} not counted (inference, RL, distillation: not pretrain_gpt.py)")
    for why, n in refused.most_common():
        print(f"{n:4d}  {why}")
    if a.megatron_check:
        valid = total - len(megatron_refuses)
        print(f"{len(megatron_refuses)} of the refused are refused by Megatron-LM's own argument checks too; "
              f"{len(accepted)} of the {valid} configurations Megatron accepts are accepted "
              f"({100.0 * len(accepted) / max(valid, 1):.1f}%)")
    return 0


def megatron_verdict(megatron: pathlib.Path, words: list, env: dict) -> str:
    """Megatron-LM's own argument checks on these flags: "accepts" or "refuses: <why>"."""
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "megatron_validate_args.py"), str(megatron), *words],
                         env=env, cwd=megatron, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        sys.exit(f"error: Megatron's argument checks did not run: {run.stderr.strip().splitlines()[-1:]}")
    return run.stdout.strip().splitlines()[-1][:160]


if __name__ == "__main__":
    sys.exit(main())
