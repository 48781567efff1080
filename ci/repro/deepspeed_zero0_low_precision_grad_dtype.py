"""DeepSpeed 0.19.8: under ZeRO 0, `safe_get_full_grad` hands back a bf16/fp16 gradient.

`deepspeed.utils.safe_get_full_grad(param)` is documented as "Assemble and return the fp32 gradient of
a low-precision (e.g., fp16) parameter" (utils/tensor_fragment.py:208). With `bf16` (or `fp16`)
enabled and ZeRO 1 or 2 it does: the fp32 gradient the optimizer step applies to its fp32 master
weights. With ZeRO 0 (FP16_UnfusedOptimizer) it returns `param.grad` as is (tensor_fragment.py:224),
in the model's dtype: the same model, config and data give a gradient of another precision type
depending on the ZeRO stage. A plain PyTorch reference that keeps fp32 master weights hands its SGD
step an fp32 gradient (what the suite records at this point); so does DeepSpeed's own step
(unfused_optimizer.py:222, `fp32_param.grad = fp16_param.grad.to(fp32_param.dtype)`), but only inside
step(), where no user can read it.

Run (CPU, one process on a single-rank gloo group, about 10 s):
python ci/repro/deepspeed_zero0_low_precision_grad_dtype.py
Exit status 1 while ZeRO 0 hands back a non-fp32 gradient, 0 once it returns fp32 as ZeRO 1/2 do.

Finding: findings/deepspeed_safe_get_full_grad_dtype.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import free_port, init_gloo, set_rank_env  # noqa: E402


def gradient_dtypes(deepspeed, stage: int) -> set:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).to(torch.bfloat16)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
           "bf16": {"enabled": True}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=cfg)
    loss = engine(torch.randn(2, 8, dtype=torch.bfloat16)).float().pow(2).sum()
    engine.backward(loss)
    found = {str(deepspeed.utils.safe_get_full_grad(p).dtype) for p in model.parameters()}
    engine.step()
    engine.destroy()
    return found


if __name__ == "__main__":
    os.environ["DS_ACCELERATOR"] = "cpu"
    set_rank_env(0, 1, free_port())
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    init_gloo()
    deepspeed.init_distributed(dist_backend="gloo")
    by_stage = {stage: gradient_dtypes(deepspeed, stage) for stage in (0, 1, 2)}
    for stage, dtypes in by_stage.items():
        print(f"bf16 model, ZeRO {stage}: safe_get_full_grad dtypes {sorted(dtypes)}")
    dist.destroy_process_group()
    wrong = by_stage[0] != {"torch.float32"}
    print("WRONG: ZeRO 0 hands back the low-precision gradient (ZeRO 1/2: fp32)" if wrong else "fp32 at every stage")
    sys.exit(1 if wrong else 0)
