"""Runs a Megatron-LM entry script (pretrain_gpt.py) where neither Apex nor Transformer Engine is
installed, filling the gaps of that setup so that Megatron can resume a distributed optimizer's
torch_dist checkpoint, and build its multi-token-prediction layers.

Without Apex or TE, torch's Adam keeps its step as a tensor in each parameter's state, and three
places of Megatron's DistributedOptimizer (commit d98e8a6) mishandle it, for every such checkpoint,
Megatron's own included:
  - state_dict() reads the step from that state and asserts there is exactly one value; loading
    builds that state dict before any step has run, when the state is still empty. Before that
    call this gives each parameter the state Adam creates on its first step (zero moments, step
    0); the checkpoint then replaces all of it, step included (Megatron takes the step from the
    saved param groups).
  - loading the fully_reshardable layout copies every tensor of a parameter's state from the
    checkpoint's per-parameter tensors, which have no step (the step is restored from the param
    groups just before): the lookup raises KeyError('step'). This makes a key the checkpoint does
    not hold read as "nothing to copy", which the method already does for non-tensors.
  - load_state_dict() restores that step as ONE tensor shared by every parameter's state, and
    torch's Adam increments each parameter's step in place: after the first step the shared
    counter has advanced once per parameter, so the bias corrections of every later step are
    wrong (the loss of the first iteration after a resume is right, the next ones drift). This
    gives each parameter its own copy of the restored step.

Without TE, Megatron cannot build a model with --mtp-num-layers either: the MTP layer asks whether
its projection is one of the inference-optimized linears, whose classes derive from TE's and are not
types when TE is absent, and isinstance() raises TypeError. No module can be one of them then, so the
answer is False.

Without Apex or TE, Megatron's only norm is a plain torch norm that refuses sequence parallelism,
which Megatron demands for tensor-parallel MoE layers. Under sequence parallelism a norm runs on its
rank's slice of the sequence unchanged; what it needs is that its weights' gradients are summed over
the tensor-parallel group, which Megatron does for every parameter marked `sequence_parallel`
(Apex's norm marks its weights so). This builds the torch norm and marks its weights the same way.

Megatron cannot load a torch_dist checkpoint of an SGD run either, its own included: loading asks
the optimizer's init_state_fn for the state to fill, and SGD has none (None is called). This gives
SGD the state it creates on its first step with momentum, a zero momentum buffer per parameter,
which the checkpoint then replaces.

Without TE, Megatron cannot build multi-latent attention either: MLA builds its core attention with
the key and value head sizes (k_channels, v_channels), which only TE's attention takes; Megatron's
local DotProductAttention refuses them. Its arithmetic already takes the head sizes from the
tensors it is given (the scores from the queries' and keys', the output from the values'); only
the width of its output, which it derives from kv_channels, must be the value heads'. This takes
both keywords and sets that width.

Usage (in a Megatron-LM checkout): python3 megatron_without_apex_or_te.py pretrain_gpt.py ARGS...
"""
import os
import runpy
import sys

import torch


def let_torch_adam_load():
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return
    original_state_dict = distrib_optimizer.DistributedOptimizer.state_dict

    def state_dict(self):
        inner = self.optimizer
        if len(inner.state) == 0 and self.init_state_fn is not None:
            self.init_state_fn(inner, self.config)
            for group in inner.param_groups:
                for param in group["params"]:
                    inner.state[param]["step"] = torch.tensor(0.0)
        return original_state_dict(self)

    distrib_optimizer.DistributedOptimizer.state_dict = state_dict

    original_set_states = distrib_optimizer.DistributedOptimizer._set_main_param_and_optimizer_states

    class NothingForMissingKeys(dict):
        def __missing__(self, key):
            return None

    def set_states(self, model_param, tensors):
        return original_set_states(self, model_param, NothingForMissingKeys(tensors))

    distrib_optimizer.DistributedOptimizer._set_main_param_and_optimizer_states = set_states

    original_load_state_dict = distrib_optimizer.DistributedOptimizer.load_state_dict

    def load_state_dict(self, state_dict):
        original_load_state_dict(self, state_dict)
        for state in self.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()

    distrib_optimizer.DistributedOptimizer.load_state_dict = load_state_dict


def let_mtp_build_without_te():
    from megatron.core.transformer import multi_token_prediction

    if not multi_token_prediction.HAVE_TE:
        multi_token_prediction.is_inference_column_parallel_linear = lambda module: False


def let_torch_norm_run_sequence_parallel():
    import copy

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    original_new = WrappedTorchNorm.__new__

    def new(cls, config, *args, **kwargs):
        if not config.sequence_parallel:
            return original_new(cls, config, *args, **kwargs)
        unsplit = copy.copy(config)
        unsplit.sequence_parallel = False
        norm = original_new(cls, unsplit, *args, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    WrappedTorchNorm.__new__ = staticmethod(new)


def let_sgd_load_torch_dist():
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    original_init = MegatronOptimizer.__init__

    def init_sgd_state(opt, config=None):
        for group in opt.param_groups:
            if group.get("momentum", 0) == 0:
                continue
            for param in group["params"]:
                if len(opt.state[param]) == 0:
                    opt.state[param]["momentum_buffer"] = torch.zeros_like(param.data)

    def init(self, optimizer, *args, **kwargs):
        original_init(self, optimizer, *args, **kwargs)
        if getattr(self, "init_state_fn", None) is None and isinstance(optimizer, torch.optim.SGD):
            self.init_state_fn = init_sgd_state

    MegatronOptimizer.__init__ = init


def let_local_attention_run_mla():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    original_init = DotProductAttention.__init__

    def init(self, config, *args, k_channels=None, v_channels=None, **kwargs):
        original_init(self, config, *args, **kwargs)
        if v_channels is not None:
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    DotProductAttention.__init__ = init


def main():
    script = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.dirname(script))
    sys.argv = [script] + sys.argv[2:]
    let_torch_adam_load()
    let_mtp_build_without_te()
    let_torch_norm_run_sequence_parallel()
    let_sgd_load_torch_dist()
    let_local_attention_run_mla()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
