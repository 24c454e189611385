"""Reads a checkpoint fp8tron wrote in Megatron's torch_dist format with PyTorch's own
distributed-checkpoint reader, as Megatron-LM loads one, and checks it against a reference.

  torch_dist_check.py metadata CKPT FIXTURE   names, global shapes and dtypes equal FIXTURE's
  torch_dist_check.py tensors CKPT REF        every tensor equals REF's: a torch_dist directory,
                                              or fp8tron's own checkpoint of one rank
  torch_dist_check.py common CKPT [FIXTURE]   the common state loads with weights_only=True (as
                                              Megatron loads it) and holds what Megatron reads;
                                              with FIXTURE, the same values as FIXTURE's
  torch_dist_check.py distopt CKPT [REF]      the distributed optimizer's fully_reshardable layout:
                                              each weight's fp32 main copy (optimizer.state.param.*,
                                              equal to the weight, or rounding to it) and moments,
                                              the layout named in the common state, Adam's step in
                                              the parameter groups; with REF (a torch_dist
                                              checkpoint of the same state without the distributed
                                              optimizer) every tensor they share equal
  torch_dist_check.py groups CKPT JSON       each optimizer's parameter groups (a chained
                                              optimizer's dense one first) hold JSON's fields, in
                                              its order: a list of lists of {field: value}

CKPT, FIXTURE, REF: iter_NNNNNNN directories. Exits 1 with one line per difference.
"""
import argparse
import io
import json
import os
import pickle
import re
import sys
import types
import warnings

import torch
import torch.distributed.checkpoint as dcp

warnings.filterwarnings("ignore")
# What fp8tron does not write (its RNG streams are not Python's; Megatron restarts both).
NOT_WRITTEN = ("rng_state/", "rerun_state_machine_state/")
problems = []


def metadata(d):
    return dcp.FileSystemReader(d).read_metadata()


def entries(d):
    out = {}
    for name, m in metadata(d).state_dict_metadata.items():
        out[name] = (tuple(m.size), m.properties.dtype) if hasattr(m, "size") else "object"
    return out


def load_all(d, only_tensors=False):
    """Every tensor and object of a torch_dist checkpoint, read by dcp.load without a process group."""
    state = {}
    for name, m in metadata(d).state_dict_metadata.items():
        if hasattr(m, "size"):
            state[name] = torch.empty(m.size, dtype=m.properties.dtype)
        elif not only_tensors:
            state[name] = io.BytesIO()
    dcp.load(state, storage_reader=dcp.FileSystemReader(d), no_dist=True)
    return state


def check_metadata(ckpt, fixture):
    mine, theirs = entries(ckpt), entries(fixture)
    for name in sorted(set(theirs) - set(mine)):
        if not name.startswith(NOT_WRITTEN):
            problems.append(f"{name}: in the fixture, not written")
    for name in sorted(set(mine) - set(theirs)):
        problems.append(f"{name}: written, not in the fixture")
    for name in sorted(set(mine) & set(theirs)):
        if mine[name] != theirs[name]:
            problems.append(f"{name}: {mine[name]} written, {theirs[name]} in the fixture")
    with open(os.path.join(ckpt, "metadata.json")) as f:
        if json.load(f) != {"sharded_backend": "torch_dist", "sharded_backend_version": 1}:
            problems.append("metadata.json is not Megatron's torch_dist one")
    tracker = os.path.join(os.path.dirname(ckpt.rstrip("/")), "latest_checkpointed_iteration.txt")
    if open(tracker).read().strip() != str(int(os.path.basename(ckpt.rstrip("/"))[5:])):
        problems.append(f"{tracker} does not name {ckpt}")


def native_tensors(d):
    """fp8tron's own checkpoint of one rank, under Megatron's names (decoder layers stacked)."""
    from safetensors.torch import load_file
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    if files != ["rank_00000.safetensors"]:
        sys.exit(f"{d}: a checkpoint of one rank is needed, it holds {files}")
    flat = load_file(os.path.join(d, files[0]))
    stacked = {}
    for name, t in flat.items():
        m = re.match(r"(.*decoder\.layers\.)(\d+)\.(.*)", name)
        if name.endswith("._extra_state"):  # FP8 recipe state: per module, under fp8tron's own name
            stacked["fp8tron_fp8_state." + name[: -len("._extra_state")]] = t
        elif m:
            stacked.setdefault(m.group(1) + m.group(3), {})[int(m.group(2))] = t
        elif name != "optimizer.state.step":
            stacked[name] = t
    return {k: (torch.stack([v[i] for i in sorted(v)]) if isinstance(v, dict) else v) for k, v in stacked.items()}


def check_tensors(ckpt, ref):
    mine = load_all(ckpt, only_tensors=True)
    theirs = native_tensors(ref) if not os.path.exists(os.path.join(ref, ".metadata")) else load_all(ref, True)
    for name in sorted(set(theirs) - set(mine)):
        problems.append(f"{name}: in {ref}, not written")
    for name in sorted(set(mine) & set(theirs)):
        if mine[name].shape != theirs[name].shape or not torch.equal(mine[name], theirs[name]):
            diff = (mine[name].float() - theirs[name].float()).abs().max().item() if mine[name].shape == theirs[name].shape else "shape"
            problems.append(f"{name}: differs from {ref} (max |difference| {diff})")
    print(f"{len(set(mine) & set(theirs))} tensors compared")


class _Stub:
    """A Megatron class (an enum of the fixture's args) where Megatron is not installed."""

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        self.state = state

    def __reduce__(self):  # pickled again as Megatron pickled it: the class called on its arguments
        return (type(self), self.args) + ((self.state,) if hasattr(self, "state") else ())


def stub_class(module, name):
    """The stand-in for Megatron's class `module.name`, registered under that module so that what
    was read with it can be pickled again under Megatron's names."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):  # importing a module imports its packages
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    stubs = sys.modules[module]
    if not hasattr(stubs, name):
        setattr(stubs, name, type(name, (_Stub,), {"__module__": module, "__qualname__": name}))
    return getattr(stubs, name)


class _StubUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("megatron."):
            return stub_class(module, name)
        return super().find_class(module, name)


_stub_pickle = types.SimpleNamespace(Unpickler=_StubUnpickler, load=pickle.load, __name__="stub_pickle")


def common_state(d, fixture=False):
    # Megatron loads it with weights_only=True after allow-listing its classes (safe_globals.py);
    # the fixture's, which names Megatron's own enums, is read with those stubbed.
    torch.serialization.add_safe_globals([argparse.Namespace])
    m = metadata(d)
    (info,) = [v for k, v in m.storage_data.items() if k.fqn == "common_state/shard_0_1"]
    with open(os.path.join(d, info.relative_path), "rb") as f:
        f.seek(info.offset)
        raw = f.read(info.length)
    if fixture:
        loaded = torch.load(io.BytesIO(raw), weights_only=False, pickle_module=_stub_pickle)
    else:
        loaded = torch.load(io.BytesIO(raw), weights_only=True)
    return loaded[0]


def chained(o):
    """The optimizers of a ChainedOptimizer's {0: ..., 1: ...} (dense, then expert parameters), or the one."""
    return [o[k] for k in sorted(o)] if o and all(isinstance(k, int) for k in o) else [o]


def optimizers(o):
    """Each optimizer's torch.optim state dict; a mixed-precision or distributed optimizer nests it
    under "optimizer"."""
    return [sub if "state" in sub else sub["optimizer"] for sub in chained(o)]


def steps(o):
    """Adam's step of each optimizer: the common step, or (distributed optimizer) its parameter groups'."""
    out = []
    for sub in optimizers(o):
        if "state" in sub:
            out.append(sub["state"]["common_step"])
        else:
            out.append({g.get("step") for g in sub["param_groups"]})
    return out


def equal_values(a, b):
    """Equal values, tensors and argparse namespaces compared by their contents."""
    if isinstance(a, argparse.Namespace) and isinstance(b, argparse.Namespace):
        return equal_values(vars(a), vars(b))
    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal_values(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(equal_values(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def check_common(ckpt, fixture):
    c = common_state(ckpt)
    # Megatron-Core up to 0.18 reads the common state from common.pt (with weights_only=True).
    common_pt = os.path.join(ckpt, "common.pt")
    if not os.path.exists(common_pt):
        problems.append("no common.pt beside the .distcp files")
    elif not equal_values(torch.load(common_pt, weights_only=True), c):
        problems.append("common.pt does not hold the common_state object's state dict")
    for key in ("args", "checkpoint_version", "iteration", "optimizer", "opt_param_scheduler",
                "num_floating_point_operations_so_far", "content_metadata"):
        if key not in c:
            problems.append(f"common state: no {key}")
    args = vars(c["args"])
    for key in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings", "padded_vocab_size",
                "tensor_model_parallel_size", "pipeline_model_parallel_size", "world_size", "data_parallel_size",
                "consumed_train_samples", "consumed_valid_samples"):
        if not isinstance(args.get(key), int):
            problems.append(f"common state: args.{key} is {args.get(key)!r}, not an int")
    if args.get("no_save_rng") is not True:
        problems.append("common state: args.no_save_rng is not True (no RNG state is written)")
    if c.get("checkpoint_version") != 3.0:
        problems.append(f"common state: checkpoint_version {c.get('checkpoint_version')}")
    for step in steps(c["optimizer"]):
        if isinstance(step, set):
            # An int, as Megatron writes it for Transformer Engine's and Apex's fused Adam (their
            # kernels take an int; torch.optim's path reads any number).
            if len(step) != 1 or type(next(iter(step))) is not int:
                problems.append(f"common state: the parameter groups' steps are {step!r}, not one int")
        elif not isinstance(step, torch.Tensor) or step.dim() != 0:
            problems.append(f"common state: optimizer.state.common_step is {step!r}, not a scalar tensor")
    if fixture is None:
        return
    f = common_state(fixture, fixture=True)
    for key in ("checkpoint_version", "iteration", "opt_param_scheduler", "content_metadata"):
        if c[key] != f[key]:
            problems.append(f"common state: {key} {c[key]!r} written, {f[key]!r} in the fixture")
    written, fixed = optimizers(c["optimizer"]), optimizers(f["optimizer"])
    if len(written) != len(fixed):
        problems.append(f"common state: {len(written)} optimizers written, {len(fixed)} in the fixture")
    for n, (o, fo) in enumerate(zip(written, fixed)):
        step = o["state"]["common_step"]
        if not torch.equal(step, fo["state"]["common_step"]):
            problems.append(f"common state: optimizer {n}: common_step {step} written, {fo['state']['common_step']} in the fixture")
        mine, theirs = o["param_groups"], fo["param_groups"]
        if len(mine) != len(theirs):
            problems.append(f"common state: optimizer {n}: {len(mine)} param_groups written, {len(theirs)} in the fixture")
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if set(a) != set(b):
                problems.append(f"common state: optimizer {n}: param_groups[{i}] keys {sorted(a)} written, {sorted(b)} in the fixture")
            for k in set(a) & set(b):
                same = abs(a[k] - b[k]) <= 1e-12 * abs(b[k]) if isinstance(b[k], float) else a[k] == b[k]
                if not same:
                    problems.append(f"common state: optimizer {n}: param_groups[{i}].{k} {a[k]!r} written, {b[k]!r} in the fixture")
    fa = vars(f["args"])
    for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels",
                "max_position_embeddings", "padded_vocab_size", "consumed_train_samples", "consumed_valid_samples",
                "seq_length", "add_position_embedding", "untie_embeddings_and_output_weights", "normalization",
                "num_query_groups", "add_bias_linear", "add_qkv_bias", "group_query_attention", "num_experts"):
        if args.get(key) != fa.get(key):
            problems.append(f"common state: args.{key} {args.get(key)!r} written, {fa.get(key)!r} in the fixture")


def check_distopt(ckpt, ref):
    tensors = load_all(ckpt, only_tensors=True)
    weights = {n: t for n, t in tensors.items() if not n.startswith("optimizer.")}
    for name, w in weights.items():
        for key in ("param", "exp_avg", "exp_avg_sq"):
            state = tensors.get(f"optimizer.state.{key}.{name}")
            if state is None or state.shape != w.shape or state.dtype != torch.float32:
                problems.append(f"optimizer.state.{key}.{name}: missing, or not fp32 of the weight's shape")
        main = tensors.get(f"optimizer.state.param.{name}")
        if main is not None and main.shape == w.shape and not torch.equal(main.to(w.dtype), w):
            problems.append(f"optimizer.state.param.{name}: does not round to the weight")
    extra = [n for n in tensors if n.startswith("optimizer.") and n.split(".", 3)[-1] not in weights]
    problems.extend(f"{n}: a state of no weight" for n in extra)
    c = common_state(ckpt)
    if c["content_metadata"].get("distrib_optim_sharding_type") != "fully_reshardable":
        problems.append(f"common state: content_metadata {c['content_metadata']!r} names no fully_reshardable layout")
    for sub in chained(c["optimizer"]):
        if sub.get("param_state_sharding_type") != "fully_reshardable" or "state" in sub.get("optimizer", {}):
            problems.append(f"common state: optimizer {sorted(sub)} is not the distributed optimizer's")
    for step in steps(c["optimizer"]):
        if not isinstance(step, set) or len(step) != 1 or type(next(iter(step))) is not int:
            problems.append(f"common state: the parameter groups' steps are {step!r}, not one int")
    if not vars(c["args"]).get("use_distributed_optimizer"):
        problems.append("common state: args.use_distributed_optimizer is not True")
    if ref:
        theirs = load_all(ref, only_tensors=True)
        shared = sorted(set(tensors) & set(theirs))
        for name in shared:
            if not torch.equal(tensors[name], theirs[name]):
                problems.append(f"{name}: differs from {ref}")
        print(f"{len(shared)} tensors compared with {ref}")
    print(f"{len(weights)} weights with their optimizer state")


def check_groups(ckpt, expected):
    want = json.loads(expected)
    have = [sub["param_groups"] for sub in optimizers(common_state(ckpt)["optimizer"])]
    if len(have) != len(want):
        problems.append(f"{len(have)} optimizers written, {len(want)} expected")
    for n, (groups, wanted) in enumerate(zip(have, want)):
        if len(groups) != len(wanted):
            problems.append(f"optimizer {n}: {len(groups)} param_groups written, {len(wanted)} expected: {groups}")
            continue
        for i, (g, w) in enumerate(zip(groups, wanted)):
            for k, v in w.items():
                same = g.get(k) == v if isinstance(v, bool) else k in g and abs(g[k] - v) <= 1e-12 * abs(v)
                if not same:
                    problems.append(f"optimizer {n}: param_groups[{i}].{k} is {g.get(k)!r}, {v!r} expected")


def main():
    what, ckpt = sys.argv[1], sys.argv[2]
    other = sys.argv[3] if len(sys.argv) > 3 else None
    {"metadata": check_metadata, "tensors": check_tensors, "common": check_common, "distopt": check_distopt,
     "groups": check_groups}[what](
        ckpt, other)
    for p in problems:
        print(p)
    print(f"{what}: {'FAIL' if problems else 'ok'}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
