#!/usr/bin/env python3
"""Whether Megatron-LM itself accepts a command line: runs its own argument parser and checks
(megatron.training.arguments parse_args and validate_args, as pretrain_gpt.py does at start-up) on
this machine's CPU, with the GPU properties those checks ask for answered as an H100's, in an
8-rank world (WORLD_SIZE, as Megatron's CI runs its test configurations) and the environment it is
given (a configuration's ENV_VARS, such as CUDA_DEVICE_MAX_CONNECTIONS, which the checks read).

Prints "accepts" or "refuses: <Megatron's message>"; exits 0 either way, 2 when Megatron cannot be
imported. Used by megatron_config_coverage.py --megatron-check to tell the configurations Megatron
refuses too from those only fp8tron refuses.

usage: scripts/megatron_validate_args.py MEGATRON_DIR [pretrain_gpt.py flags...]
"""
import contextlib
import io
import os
import sys
import types
import typing
import warnings


def answer_gpu_queries(torch) -> None:
    """validate_args and the modules it imports ask for the GPU's name and compute capability."""
    props = types.SimpleNamespace(major=9, minor=0, name="NVIDIA H100 80GB HBM3", total_memory=80 << 30,
                                  multi_processor_count=132)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: int(os.environ["WORLD_SIZE"])
    torch.cuda.get_device_capability = lambda *a, **k: (props.major, props.minor)
    torch.cuda.get_device_name = lambda *a, **k: props.name
    torch.cuda.get_device_properties = lambda *a, **k: props


def main() -> int:
    megatron_dir, flags = sys.argv[1], sys.argv[2:]
    warnings.filterwarnings("ignore")
    os.environ.setdefault("WORLD_SIZE", "8")
    os.environ.update(RANK="0", LOCAL_RANK="0")
    if not hasattr(typing, "override"):  # Megatron uses Python 3.12's typing.override
        typing.override = lambda f: f
    sys.path.insert(0, megatron_dir)
    import torch
    answer_gpu_queries(torch)
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            from megatron.training.arguments import parse_args, validate_args
    except Exception as e:  # noqa: BLE001 - any import failure means this checkout cannot answer
        print(f"error: cannot import Megatron-LM from {megatron_dir}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    sys.argv = ["pretrain_gpt.py", *flags]
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            validate_args(parse_args(), {})
        print("accepts")
    except SystemExit:  # argparse: the last line of its usage message says why
        lines = output.getvalue().strip().splitlines()
        print("refuses: " + (lines[-1] if lines else "argparse error"))
    except Exception as e:  # noqa: BLE001 - Megatron's checks are asserts and ValueErrors
        print(f"refuses: {type(e).__name__}: {' '.join(str(e).split())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
