"""DeepSpeed 0.19.8: an engine with `torch_autocast` leaves process-global state that makes every later
ZeRO 1/2/3 engine in the process ignore its `communication_data_type`.

init_autocast_params (runtime/torch_autocast.py) sets the module globals TORCH_AUTOCAST_INITIALIZED = True
and TORCH_AUTOCAST_DTYPE; nothing resets them (engine.destroy() included). The ZeRO optimizers ask
is_autocast_initialized() rather than their own engine's config: base_optimizer.get_param_comm_dtype
then returns the parameter's `comm_dtype` mark or, unmarked, the parameter's own dtype, and
stage_1_and_2.py:609 builds its gradient buckets from those dtypes instead of communication_data_type.
So a second model in the same process (a notebook, a sweep, a trainer's evaluation or distillation
model) with `bf16` and `communication_data_type: fp32` and no torch_autocast at all reduces its
gradients in bf16. No error or warning; the first engine has been destroyed.

Plain PyTorch has no such state: torch.autocast is a context manager and leaves nothing behind. The
fresh-process run of the same second engine is the reference here (what its config asks for).

Run (CPU, 4 processes over gloo, about 60 s):  python ci/repro/deepspeed_torch_autocast_state_leaks.py
Exit status 1 while the second engine's reduction dtype follows the first engine's autocast rather than
its own config, 0 once it follows its config.

Finding: findings/deepspeed_torch_autocast_state_leaks.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

WORLD = 4  # data-parallel ranks: at 2 a bf16 and an fp32 sum of two bf16 values round to the same bf16


def second_engine(rank: int, autocast_engine_first: bool):
    import deepspeed
    import deepspeed.runtime.torch_autocast as torch_autocast
    from deepspeed.utils import safe_get_full_grad

    if autocast_engine_first:
        first = nn.Linear(4, 4)
        engine, *_ = deepspeed.initialize(model=first, model_parameters=first.parameters(),
                                          optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                                          config={"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9,
                                                  "torch_autocast": {"enabled": True, "dtype": "bfloat16"}})
        engine.destroy()
    leftover = (torch_autocast.TORCH_AUTOCAST_INITIALIZED, str(torch_autocast.TORCH_AUTOCAST_DTYPE))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8)).to(torch.bfloat16)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "bf16": {"enabled": True}, "communication_data_type": "fp32"}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=config)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(10 + rank)).to(torch.bfloat16)
    engine.backward(engine(x).float().pow(2).sum())
    grad = torch.cat([safe_get_full_grad(p).flatten() for p in model.parameters()])
    reduction_dtypes = sorted(str(dtype) for dtype in engine.optimizer.ipg_buckets)
    engine.destroy()
    return leftover, reduction_dtypes, grad


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result[rank] = second_engine(rank, os.environ["AUTOCAST_ENGINE_FIRST"] == "1")


if __name__ == "__main__":
    fresh = run_ranks(rank_main, WORLD, env={"DS_ACCELERATOR": "cpu", "AUTOCAST_ENGINE_FIRST": "0"}, init=False)
    after = run_ranks(rank_main, WORLD, env={"DS_ACCELERATOR": "cpu", "AUTOCAST_ENGINE_FIRST": "1"}, init=False)
    (_, fresh_dtypes, fresh_grad), (leftover, after_dtypes, after_grad) = fresh[0], after[0]
    differ = int((fresh_grad != after_grad).sum())
    print(f"after the torch_autocast engine's destroy(): TORCH_AUTOCAST_INITIALIZED, TORCH_AUTOCAST_DTYPE = {leftover}")
    print(f"second engine (bf16, ZeRO 2, communication_data_type fp32) reduces in: fresh process {fresh_dtypes}, "
          f"after the autocast engine {after_dtypes}")
    print(f"its step gradient: {differ} of {fresh_grad.numel()} entries differ, max |diff| "
          f"{float((fresh_grad - after_grad).abs().max()):.3e} (max |grad| {float(fresh_grad.abs().max()):.3e})")
    wrong = after_dtypes != fresh_dtypes
    print("WRONG: the leftover autocast state overrides communication_data_type" if wrong
          else "the second engine follows its own config")
    sys.exit(1 if wrong else 0)
