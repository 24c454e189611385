"""Megatron-LM legacy torch checkpoints of precisions and layouts that no fixture holds, made from
fixtures that Megatron-LM wrote and laid out as Megatron-LM's code writes them (its
checkpointing.py, optimizer.py and the modules' state dicts, at the fixtures' commit):

  megatron_legacy_variants.py bf16 OUT
      gpt_torch_legacy as a bf16 run saves it: the weights in bf16, and the state dict of Megatron's
      mixed-precision optimizer (Float16OptimizerWithFloat16Params): {"optimizer": torch.optim's,
      "fp32_from_fp16_params": each parameter group's fp32 main weights in the group's order}
  megatron_legacy_variants.py distopt OUT
      gpt_dp2_distopt_torch_dist (two data-parallel ranks, --use-distributed-optimizer) in the torch
      format: model_optim_rng.pt holds the weights and only the optimizer's parameter groups, Adam's
      step in each (DistributedOptimizer.state_dict), and distrib_optim.pt the flat buffers that
      DistributedOptimizer.save_parameter_state gathers: {"buckets_coalesced": True, 0: {dtype:
      {"param", "exp_avg", "exp_avg_sq", "numel_unpadded"}}}, the buckets concatenated
  megatron_legacy_variants.py sgd OUT TORCH_DIST_DIR
      an SGD run of the GPT fixtures' model that fp8tron saved in torch_dist (TORCH_DIST_DIR, an
      iter_NNNNNNN directory) in the torch format: torch.optim.SGD's state dict, a momentum_buffer
      per parameter numbered group by group, its parameter groups as the torch_dist common state
      holds them, no step
  megatron_legacy_variants.py moe OUT EP [TP [ETP]]
      moe_ep2_torch_dist in the torch format, saved by EP expert-parallel ranks (mp_rank_00, or
      mp_rank_<tp>_<ep> each; with TP tensor-parallel ranks too, the experts split as the dense
      MLP, --expert-tensor-parallel-size TP; with ETP 1 whole experts on every tensor-parallel
      rank, over TP x EP ranks of which only those first in their data-parallel or
      expert-data-parallel group write, as Megatron's save_checkpoint does (TP2 x EP2:
      mp_rank_00_000 and mp_rank_01_001); another ETP only changes what the saved arguments say,
      for a checkpoint fp8tron must refuse): the model's state dict under its modules' names (the
      sequential experts as local_experts.<i>, numbered from 0 on each rank) and the state dict of
      a ChainedOptimizer, the list of the dense and the expert parameters' torch.optim state dicts,
      each numbering its own parameters in module order, group by group

OUT is written as a checkpoint directory (latest_checkpointed_iteration.txt, iter_0000010/). The
fp32 values are the fixture's, so a resume of the bf16 one's main weights, or of the MoE one,
prints the fixture's losses.
"""
import copy
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_dist_check as dist  # noqa: E402  (its readers of Megatron's pickles and DCP files)

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "megatron_checkpoints")
ITERATION = 10


def load_legacy(path):
    return torch.load(path, map_location="cpu", weights_only=False, pickle_module=dist._stub_pickle)


def save(out, state, rank_dir="mp_rank_00"):
    d = os.path.join(out, f"iter_{ITERATION:07d}", rank_dir)
    os.makedirs(d, exist_ok=True)
    torch.save(state, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def decayed(name, t):
    """Megatron's default parameter groups: weight decay for all but biases and 1-D weights."""
    return not name.endswith(".bias") and t.dim() > 1


def grouped(params):
    """torch.optim numbers parameters group by group; Megatron's groups: decayed (its default
    configuration, sorted first), then no weight decay. Returns each group's names."""
    return [[n for n, t in params if decayed(n, t)], [n for n, t in params if not decayed(n, t)]]


def bf16(out):
    state = load_legacy(os.path.join(FIXTURES, "gpt_torch_legacy", "ckpt", "iter_0000010", "mp_rank_00",
                                     "model_optim_rng.pt"))
    model = state["model"]
    params = [(n, t) for n, t in model.items() if not n.endswith("._extra_state")]
    groups = grouped(params)
    optimizer = state["optimizer"]
    index = 0
    for g, names in enumerate(groups):  # the fixture's groups are these, numbered in this order
        assert optimizer["param_groups"][g]["params"] == list(range(index, index + len(names))), g
        index += len(names)
    main = [[model[n].clone() for n in names] for names in groups]
    state["optimizer"] = {"optimizer": optimizer, "fp32_from_fp16_params": main}
    state["model"] = {n: (t.to(torch.bfloat16) if torch.is_tensor(t) else t) for n, t in model.items()}
    state["args"].bf16 = True
    state["args"].params_dtype = torch.bfloat16
    save(out, state)


def legacy_gpt_model(tensors, template):
    """The model state dict of the GPT fixtures' legacy files (`template`'s names and order) with
    the values of a torch_dist checkpoint's `tensors` (layers stacked, the norms under the fused
    names of Megatron's sharded state dict)."""
    fused = {"input_layernorm": "self_attention.linear_qkv.layer_norm_", "pre_mlp_layernorm": "mlp.linear_fc1.layer_norm_"}
    model = {}
    for name in template:
        m = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
        if name.endswith("._extra_state"):
            model[name] = None
        elif m:
            field = m.group(2)
            norm, _, kind = field.partition(".")
            stored = fused[norm] + kind if norm in fused else field
            model[name] = tensors["decoder.layers." + stored][int(m.group(1))].clone()
        else:
            model[name] = tensors[name].clone()
    return model


def distopt(out):
    src = os.path.join(FIXTURES, "gpt_dp2_distopt_torch_dist", "ckpt", "iter_0000010")
    tensors = dist.load_all(src, only_tensors=True)
    state = load_legacy(os.path.join(FIXTURES, "gpt_torch_legacy", "ckpt", "iter_0000010", "mp_rank_00",
                                     "model_optim_rng.pt"))
    state["model"] = legacy_gpt_model(tensors, state["model"])
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state["optimizer"]["param_groups"]]
    state["optimizer"] = {"optimizer": {"param_groups": [dict(g, step=ITERATION) for g in groups]}}
    state["args"].use_distributed_optimizer = True
    save(out, state)
    buffers = {}
    prefix = "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.float32, torch.float32).bucket_idx_"
    for key in ("param", "exp_avg", "exp_avg_sq"):
        buckets = sorted((n for n in tensors if n.startswith(prefix) and n.endswith("." + key)),
                         key=lambda n: int(n[len(prefix):].split(".")[0]))
        assert len(buckets) == 1, buckets  # one bucket: its end padding may stay
        buffers[key] = torch.cat([tensors[n] for n in buckets])
    buffers["numel_unpadded"] = buffers["param"].numel()
    torch.save({"buckets_coalesced": True, 0: {torch.float32: buffers}},
               os.path.join(out, f"iter_{ITERATION:07d}", "mp_rank_00", "distrib_optim.pt"))


def sgd(out, src):
    tensors = dist.load_all(src, only_tensors=True)
    common = dist.common_state(src)
    state = load_legacy(os.path.join(FIXTURES, "gpt_torch_legacy", "ckpt", "iter_0000010", "mp_rank_00",
                                     "model_optim_rng.pt"))
    state["model"] = legacy_gpt_model(tensors, state["model"])
    momentum = legacy_gpt_model({n[len("optimizer.state.momentum_buffer."):]: t for n, t in tensors.items()
                                 if n.startswith("optimizer.state.momentum_buffer.")}, state["model"])
    params = [(n, t) for n, t in state["model"].items() if t is not None]
    saved = common["optimizer"]["param_groups"]
    groups, states, index = [], {}, 0
    for saved_group, names in zip(saved, grouped(params)):
        groups.append(dict(saved_group, params=list(range(index, index + len(names)))))
        for n in names:
            states[index] = {"momentum_buffer": momentum[n]}
            index += 1
    state["optimizer"] = {"state": states, "param_groups": groups}
    state["opt_param_scheduler"] = common["opt_param_scheduler"]
    state["args"].optimizer = "sgd"
    save(out, state)


def moe_layer_names(layer, local_experts):
    """(legacy name, torch_dist name, index into its stacked dimensions after the layer's) of one
    MoE layer's tensors in module order: the norms, attention (its projection registered first),
    the router, then the sequential experts."""
    head, stacked = f"decoder.layers.{layer}.", "decoder.layers."
    out = [("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight", ()),
           ("input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias", ()),
           ("self_attention.linear_proj.weight", "self_attention.linear_proj.weight", ()),
           ("self_attention.linear_proj._extra_state", None, ()),
           ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.weight", ()),
           ("self_attention.linear_qkv._extra_state", None, ()),
           ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight", ()),
           ("pre_mlp_layernorm.bias", "mlp.linear_fc1.layer_norm_bias", ()),
           ("mlp.router.weight", "mlp.router.weight", ())]
    for local, expert in local_experts:
        for fc in ("linear_fc1", "linear_fc2"):
            out.append((f"mlp.experts.local_experts.{local}.{fc}.weight", f"mlp.experts.experts.{fc}.weight", (expert,)))
            out.append((f"mlp.experts.local_experts.{local}.{fc}._extra_state", None, ()))
    return [(head + legacy, stacked + stored if stored else None, (layer,) + at) for legacy, stored, at in out]


def tp_part(name, t, rank, tp, swiglu):
    """Tensor-parallel rank `rank`'s part of `t` as Megatron splits it: column-parallel layers by
    rows (a SwiGLU fc1 as its gate's part, then its up's), row-parallel ones by columns."""
    if tp == 1 or t is None:
        return t
    if re.search(r"(word_embeddings|linear_qkv)\.weight$", name):
        return t.chunk(tp, 0)[rank].clone()
    if re.search(r"linear_fc1\.weight$", name):
        if swiglu:
            gate, up = t.chunk(2, 0)
            return torch.cat([gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]]).clone()
        return t.chunk(tp, 0)[rank].clone()
    if re.search(r"(linear_proj|linear_fc2)\.weight$", name):
        return t.chunk(tp, 1)[rank].clone()
    return t


def moe(out, ranks, tp=1, etp=None):
    src = os.path.join(FIXTURES, "moe_ep2_torch_dist", "ckpt", "iter_0000010")
    tensors = dist.load_all(src, only_tensors=True)
    common = dist.common_state(src, fixture=True)
    args = common["args"]
    layers, experts = args.num_layers, args.num_experts
    local = experts // ranks
    step = common["optimizer"][0]["state"]["common_step"]
    whole = etp == 1 and tp > 1
    writers = [(r, t) for t in range(tp) for r in range(ranks)]
    if whole:
        # Global rank g: dense tensor rank g % tp, data-parallel rank g // tp; expert rank g % ranks,
        # expert-data-parallel rank g // ranks (Megatron's rank generators, order tp-cp-ep-dp-pp).
        writers = [(g % ranks, g % tp) for g in range(tp * ranks) if g // tp == 0 or g // ranks == 0]
    for rank, t in writers:
        names = [("embedding.word_embeddings.weight", "embedding.word_embeddings.weight", ()),
                 ("embedding.position_embeddings.weight", "embedding.position_embeddings.weight", ())]
        for layer in range(layers):
            names += moe_layer_names(layer, [(i, rank * local + i) for i in range(local)])
        names += [("decoder.final_layernorm.weight", "decoder.final_layernorm.weight", ()),
                  ("decoder.final_layernorm.bias", "decoder.final_layernorm.bias", ()),
                  ("output_layer._extra_state", None, ())]
        def part(name, tensor):
            return tensor.clone() if whole and ".mlp.experts." in name else tp_part(name, tensor, t, tp, args.swiglu)
        model = {legacy: (part(legacy, tensors[stored][at]) if stored else None) for legacy, stored, at in names}
        source = {legacy: (stored, at) for legacy, stored, at in names if stored}
        params = [(n, t) for n, t in model.items() if t is not None]
        chain = []
        for k, is_expert in enumerate((False, True)):
            mine = [(n, t) for n, t in params if (".mlp.experts." in n) == is_expert]
            groups = [g for g in grouped(mine) if g]
            saved = common["optimizer"][k]["param_groups"]
            assert len(saved) == len(groups), (k, len(saved), len(groups))
            param_groups, states, index = [], {}, 0
            for saved_group, group in zip(saved, groups):
                param_groups.append(dict(copy.deepcopy(saved_group), params=list(range(index, index + len(group)))))
                for n in group:
                    stored, at = source[n]
                    moment = lambda key: part(n, tensors[f"optimizer.state.{key}." + stored][at])
                    states[index] = {"step": step.clone(), "exp_avg": moment("exp_avg").clone(),
                                     "exp_avg_sq": moment("exp_avg_sq").clone()}
                    index += 1
            chain.append({"state": states, "param_groups": param_groups})
        saved_args = copy.copy(args)
        saved_args.ckpt_format = "torch"
        saved_args.expert_model_parallel_size = ranks
        saved_args.tensor_model_parallel_size = saved_args.expert_tensor_parallel_size = tp
        if etp is not None:
            saved_args.expert_tensor_parallel_size = etp
        state = {"args": saved_args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model,
                 "optimizer": chain, "opt_param_scheduler": common["opt_param_scheduler"],
                 "num_floating_point_operations_so_far": common["num_floating_point_operations_so_far"]}
        save(out, state, f"mp_rank_{t:02d}" + (f"_{rank:03d}" if ranks > 1 else ""))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("bf16", "distopt"):
        globals()[sys.argv[1]](sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "sgd":
        sgd(sys.argv[2], sys.argv[3])
    elif len(sys.argv) in (4, 5, 6) and sys.argv[1] == "moe":
        moe(sys.argv[2], *map(int, sys.argv[3:]))
    else:
        sys.exit(__doc__)
