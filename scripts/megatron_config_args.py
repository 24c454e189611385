#!/usr/bin/env python3
"""Carries Megatron-LM test configurations into tests/cli/megatron_configs/: the MODEL_ARGS of
tests/functional_tests/test_cases/<gpt|moe>/<name>/model_config.yaml as a <name>.args file, one flag
per line, shell-quoted, as Megatron's launcher passes them (true: the bare switch; false or null:
left out; a value in brackets: its words), the data paths replaced by the placeholders that
tests/cli/megatron_configs/test_data.sh exports. Megatron's CI runs them on 8 ranks.

usage: scripts/megatron_config_args.py MEGATRON_DIR [--commit SHA] NAME [NAME...]
  NAME: gpt/<name> or moe/<name>; --commit names the Megatron-LM commit when MEGATRON_DIR is not a
  git checkout (an exported tree)
"""
import pathlib
import re
import shlex
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "cli" / "megatron_configs"
# A path under one of Megatron's data placeholders becomes the placeholder: our test data stands
# in for Megatron's corpora, tokenizers and checkpoint directories.
PATH_FLAGS = {"--data-path": "DATA_PATH", "--vocab-file": "VOCAB_FILE", "--merge-file": "MERGE_FILE",
              "--tokenizer-model": "TOKENIZER_MODEL", "--load": "CHECKPOINT_LOAD_PATH",
              "--save": "CHECKPOINT_SAVE_PATH"}


def quoted(word: str) -> str:
    """Shell-quoted, keeping ${PLACEHOLDER}s open so that the tests' eval expands them."""
    if re.fullmatch(r"[\w@%+=:,./${}-]+", word):
        return word
    return shlex.quote(word) if "$" not in word else '"' + word.replace('"', '\\"') + '"'


def lines_of(model_args: dict) -> list:
    """The flags; the values are YAML's text (read with the base loader, so 4.5e-4 stays 4.5e-4)."""
    lines = []
    for flag, text in model_args.items():
        if text in ("false", "False", "null", "~", ""):
            continue
        if text in ("true", "True"):
            lines.append(flag)
            continue
        if flag in PATH_FLAGS and "$" in text:
            lines.append(f"{flag} ${{{PATH_FLAGS[flag]}}}")
        elif re.fullmatch(r"\[[^]]+\]", text):
            lines.append(" ".join([flag, *(quoted(w) for w in text[1:-1].split())]))
        else:
            lines.append(f"{flag} {quoted(text)}")
    return lines


def main() -> int:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    megatron, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
    commit = subprocess.run(["git", "-C", str(megatron), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    if names[0] == "--commit":
        commit, names = names[1][:12], names[2:]
    if not commit:
        sys.exit(f"error: {megatron} is not a git checkout: pass --commit SHA")
    for name in names:
        source = f"tests/functional_tests/test_cases/{name}/model_config.yaml"
        config = yaml.load((megatron / source).read_text(), Loader=yaml.BaseLoader)
        header = [f"# Megatron-LM {source} @ {commit}",
                  f"# world-size: 8  (pretrain_gpt.py under torchrun; TEST_TYPE {config.get('TEST_TYPE', 'regular')})",
                  "# format: one flag per line, shell-quoted; data paths replaced by ${...} placeholders"]
        target = OUT / (pathlib.Path(name).name + ".args")
        target.write_text("\n".join(header + lines_of(config["MODEL_ARGS"])) + "\n")
        print(target.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
