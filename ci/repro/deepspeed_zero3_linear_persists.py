"""DeepSpeed 0.19.8: a ZeRO 3 engine leaves torch.nn.functional.linear replaced for the rest of the process.

zero.Init (which deepspeed.initialize runs for a ZeRO 3 model) swaps torch.nn.functional.linear for its
own zero3_linear_wrap (runtime/zero/partition_parameters.py:412-419), logging "This will persist unless
manually reset" only with force=False, i.e. not at all. engine.destroy() does not put it back. Every
model built later in the same process, with or without DeepSpeed, then runs its nn.Linear layers through
LinearFunctionForZeroStage3: for an input of more than two dimensions with a bias its forward is
input.matmul(weight.t()) followed by `output += bias` (runtime/zero/linear.py), two roundings in bf16
where torch's linear adds the bias inside the GEMM, and its backward its own matmuls. A user who trains,
evaluates or fine-tunes a second model after a ZeRO 3 run (a notebook, a sweep in one process, a
trainer's evaluation model) gets other numbers than a fresh process would, without a word.

Run (CPU, 1 process over gloo, about 15 s): python ci/repro/deepspeed_zero3_linear_persists.py
Exit status 1 while F.linear is still DeepSpeed's after the engine is destroyed, 0 once it is torch's.

Finding: findings/deepspeed_zero3_linear_persists.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402


def linear_name() -> str:
    f = torch.nn.functional.linear
    return f"{f.__module__}.{f.__name__}"


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    # A second model's layer and input, made before anything runs: bf16, a [batch, tokens, hidden] input.
    layer = nn.Linear(32, 34).to(torch.bfloat16)
    x = torch.randn(2, 6, 32).to(torch.bfloat16)
    before_name, before = linear_name(), layer(x).detach()

    first = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9,
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
           "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=first, model_parameters=first.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=cfg)
    engine.destroy()
    after = layer(x).detach()
    result.update(before=before_name, after=linear_name(), differ=int((after != before).sum()),
                  max_diff=float((after.double() - before.double()).abs().max()), size=before.numel())


if __name__ == "__main__":
    result = run_ranks(rank_main, 1, env={"DS_ACCELERATOR": "cpu"}, init=False)
    print(f"torch.nn.functional.linear before the ZeRO 3 engine: {result['before']}")
    print(f"after engine.destroy():                              {result['after']}")
    print(f"the same bf16 nn.Linear on the same input: {result['differ']} of {result['size']} outputs differ "
          f"(largest {result['max_diff']:.3g})")
    sys.exit(1 if result["after"] != result["before"] else 0)
