"""Runs a Megatron-LM entry script (pretrain_gpt.py) where neither Apex nor Transformer Engine is
installed, filling one gap of that setup so that Megatron can load a distributed optimizer's
torch_dist checkpoint.

Without Apex or TE, Megatron's DistributedOptimizer.state_dict() reads Adam's step from the torch
optimizer's per-parameter state and asserts there is exactly one value. Loading builds that state
dict before any step has run, when the state is still empty, so the assertion fails for every
such checkpoint, Megatron's own included. Before that call this gives each parameter the state
Adam creates on its first step (zero moments, step 0); the checkpoint then replaces all of it,
step included (Megatron takes the step from the saved param groups).

Usage (in a Megatron-LM checkout): python3 megatron_without_apex_or_te.py pretrain_gpt.py ARGS...
"""
import os
import runpy
import sys

import torch


def give_fresh_optimizer_a_step():
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


def main():
    script = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.dirname(script))
    sys.argv = [script] + sys.argv[2:]
    give_fresh_optimizer_a_step()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
