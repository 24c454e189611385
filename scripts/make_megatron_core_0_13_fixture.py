"""Makes tests/fixtures/megatron_checkpoints/gpt_tp2dp2_distopt_core_0_13: the state of the fixture
gpt_torch_dist (Megatron-LM's own run, iteration 10) saved as Megatron-Core 0.13 saves a run of
two tensor-parallel by two data-parallel ranks with --use-distributed-optimizer, by Megatron-Core
0.13's own dist_checkpointing on four CPU processes (gloo):

  - the common state in common.pt beside the .distcp files (Megatron-Core up to 0.18 writes it
    there; later versions store it inside the distributed checkpoint, as the other fixtures have it);
  - the distributed optimizer's state in Megatron-Core 0.13's default layout with
    --ckpt-fully-parallel-save, fully_sharded_model_space: for each weight,
    optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<the weight's key>, each data-parallel rank's
    flattened range of its tensor-parallel part, which Megatron's torch_dist strategy stores
    reformulated as a tensor of shape (the weight's chunks per axis..., elements of one chunk).

The sharded state dict is built as Megatron-Core 0.13 builds it: the model's ShardedTensors as its
GPT layers make them (layers stacked on a first axis, column-parallel weights split by rows,
row-parallel ones by columns, the rest replicated with the tensor rank in the replica id), and the
optimizer's as DistributedOptimizer.sharded_param_state_fs_model_space makes them (dataclasses.replace
of the weight's ShardedTensor with the state's key, data and flattened range, the data-parallel
coordinate of the replica id set to 0). Each data-parallel rank owns a contiguous range of the
weights laid end to end, as the distributed optimizer's gradient buffer gives it, so weights are cut
between the ranks.

Run from the repository root, with a Megatron-LM checkout at tag core_v0.13.0 (its megatron/core is
enough), torch and psutil (its writer logs memory through it):
  PYTHONPATH=MEGATRON_LM_DIR python -m torch.distributed.run --nproc-per-node 4 \
      scripts/make_megatron_core_0_13_fixture.py OUT_DIR
OUT_DIR gets ckpt/ (latest_checkpointed_iteration.txt, iter_0000010/), args.txt and losses.txt (the
source fixture's: the same state resumes to the same losses).
"""
import dataclasses
import os
import shutil
import sys

import numpy as np
import torch
import torch.distributed as dist

if not hasattr(np, "product"):  # Megatron-Core 0.13's validation predates NumPy 2, which dropped it
    np.product = np.prod
if not torch.cuda.is_available():  # its writer syncs the GPU and ranks through GPU tensors; gloo takes CPU ones
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: "cpu"

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing import ShardedTensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "checkpoint"))
import torch_dist_check as dcp_files  # noqa: E402  (reads the source fixture's tensors and common state)

SOURCE = os.path.join(ROOT, "tests", "fixtures", "megatron_checkpoints", "gpt_torch_dist")
TP, DP, ITERATION = 2, 2, 10
COLUMN_PARALLEL = (".linear_qkv.weight", ".linear_qkv.bias", ".linear_fc1.weight", ".linear_fc1.bias",
                   "word_embeddings.weight")
ROW_PARALLEL = (".linear_proj.weight", ".linear_fc2.weight")


def tp_axis(key):
    if key.endswith(COLUMN_PARALLEL):
        return 0
    if key.endswith(ROW_PARALLEL):
        return 1
    return None


def model_sharded_tensors(weights, tp, dp):
    """{key: [ShardedTensor per layer]} of this rank's parts, as Megatron-Core's GPT model makes them."""
    out = {}
    for key, whole in weights.items():
        stacked = key.startswith("decoder.layers.")
        layers = [whole[i] for i in range(whole.shape[0])] if stacked else [whole]
        axis = tp_axis(key)
        out[key] = []
        for index, param in enumerate(layers):
            prepend = ((0, index, len(layers)),) if stacked else ()
            if axis is None:
                local, offsets, replica = param.clone(), (), (0, tp, dp)
            else:
                local = param.chunk(TP, axis)[tp].clone()
                offsets, replica = ((axis + len(prepend), tp, TP),), (0, 0, dp)
            out[key].append(ShardedTensor.from_rank_offsets(key, local, *prepend, *offsets, replica_id=replica,
                                                            prepend_axis_num=len(prepend)))
    return out


def optimizer_sharded_tensors(model, states, tp, dp):
    """sharded_param_state_fs_model_space's tensors: each part's flattened range on data-parallel
    rank dp, the parts laid end to end in the order of the gradient buffer (the reverse of the
    model's), the whole split evenly over the data-parallel ranks."""
    parts = [(key, i, sh) for key in reversed(list(model)) for i, sh in enumerate(model[key])]
    total = sum(sh.data.numel() for _, _, sh in parts)
    per_rank = -(-total // DP)
    begin, end = dp * per_rank, (dp + 1) * per_rank
    out, at = {}, 0
    for key, index, sh in parts:
        lo, hi = max(begin, at), min(end, at + sh.data.numel())
        at += sh.data.numel()
        if lo >= hi:
            continue
        flat = slice(lo - (at - sh.data.numel()), hi - (at - sh.data.numel()))
        for state, values in states.items():
            whole = values[key][index] if key.startswith("decoder.layers.") else values[key]
            axis = tp_axis(key)
            local = whole if axis is None else whole.chunk(TP, axis)[tp]
            data = local.reshape(-1)[flat].clone()
            name = f"optimizer.state.{state}.{key}"
            st = dataclasses.replace(sh, key=name, data=data, dtype=data.dtype, flattened_range=flat,
                                     replica_id=(*sh.replica_id[:2], 0))
            st.validate_metadata_integrity()
            out[f"{name}.{index}"] = st
    return out


def main():
    out_dir = os.path.abspath(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tp, dp = rank % TP, rank // TP  # Megatron's rank order: tensor-parallel ranks adjacent
    src = os.path.join(SOURCE, "ckpt", f"iter_{ITERATION:07d}")
    tensors = dcp_files.load_all(src, only_tensors=True)
    weights = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    states = {"fp32_param": weights}  # an fp32 run: the main weights are the weights
    for state in ("exp_avg", "exp_avg_sq"):
        states[state] = {k: tensors[f"optimizer.state.{state}.{k}"] for k in weights}
    common = dcp_files.common_state(src, fixture=True)
    model = model_sharded_tensors(weights, tp, dp)
    optimizer = common["optimizer"]
    groups = [dict(g, step=optimizer["state"]["common_step"].item()) for g in optimizer["param_groups"]]
    state_dict = dict(common)
    state_dict["model"] = {f"{key}.{i}": sh for key, shs in model.items() for i, sh in enumerate(shs)}
    state_dict["optimizer"] = {
        "optimizer": {"param_groups": groups},
        "param_state": optimizer_sharded_tensors(model, states, tp, dp),
        "param_state_sharding_type": "fully_sharded_model_space",
    }
    args = common["args"]
    args.use_distributed_optimizer = True
    args.tensor_model_parallel_size, args.data_parallel_size, args.world_size = TP, DP, TP * DP
    args.ckpt_fully_parallel_save = True
    state_dict["content_metadata"] = {"distrib_optim_sharding_type": "fully_sharded_model_space",
                                      "singleton_local_shards": False}
    ckpt = os.path.join(out_dir, "ckpt", f"iter_{ITERATION:07d}")
    if rank == 0:
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(ckpt)
        with open(os.path.join(out_dir, "ckpt", "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
        for name in ("args.txt", "losses.txt"):
            shutil.copy(os.path.join(SOURCE, name), out_dir)
    dist.barrier()
    dist_checkpointing.save(state_dict, ckpt)
    dist.barrier()
    if rank == 0:
        print(f"wrote {ckpt}: {sorted(os.listdir(ckpt))}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
