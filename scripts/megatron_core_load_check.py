"""Loads a torch_dist checkpoint (fp8tron's, or any one-rank GPT checkpoint) with a Megatron-Core
version's own dist_checkpointing on the CPU, as that version's training would: its common state
(load_common_state_dict: common.pt up to Megatron-Core 0.18, the "common_state" object after) and
every tensor, each a ShardedTensor of the whole weight (stacked decoder-layer tensors one layer at a
time), compared with PyTorch's own distributed-checkpoint reader. Prints one summary line; exits 1
when a tensor differs or the load fails.

  PYTHONPATH=MEGATRON_LM_DIR python scripts/megatron_core_load_check.py CKPT/iter_NNNNNNN

MEGATRON_LM_DIR: a Megatron-LM checkout (its megatron/core is enough) of the version to check.
"""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

if not hasattr(np, "product"):  # Megatron-Core before 0.14 predates NumPy 2, which dropped it
    np.product = np.prod
if not torch.cuda.is_available():  # its loader syncs through GPU tensors; gloo takes CPU ones
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: "cpu"

from megatron.core import dist_checkpointing  # noqa: E402
from megatron.core.dist_checkpointing import ShardedTensor  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "checkpoint"))
import torch_dist_check as dcp_files  # noqa: E402


def stacked(name):
    return name.startswith("decoder.layers.") or ".decoder.layers." in name


def main():
    ckpt = sys.argv[1]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    common = dist_checkpointing.load_common_state_dict(ckpt)
    reference = dcp_files.load_all(ckpt, only_tensors=True)
    request = {}
    for name, value in reference.items():
        if stacked(name):
            for i in range(value.shape[0]):
                request[f"{name}.{i}"] = ShardedTensor.from_rank_offsets(
                    name, torch.zeros_like(value[i]), (0, i, value.shape[0]), replica_id=(0, 0, 0), prepend_axis_num=1)
        else:
            request[name] = ShardedTensor.from_rank_offsets(name, torch.zeros_like(value), replica_id=(0, 0, 0))
    loaded = dist_checkpointing.load(request, ckpt)
    differ = []
    for key in request:
        base, _, index = key.rpartition(".")
        want = reference[base][int(index)] if stacked(base) and index.isdigit() and base in reference else reference[key]
        if not torch.equal(loaded[key], want):
            differ.append(key)
    print(f"megatron.core ({dist_checkpointing.__file__}) loaded {ckpt}: iteration {common['iteration']}, "
          f"{len(request)} tensors, {len(differ)} differing from torch.distributed.checkpoint's read {differ[:3]}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
