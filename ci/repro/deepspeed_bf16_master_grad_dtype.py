"""DeepSpeed 0.19.8: with bf16 master weights and gradients, `safe_get_full_grad` hands back float32.

`bf16: {bf16_master_weights_and_grads: true, bf16_optimizer_states: true}` under ZeRO 1/2 makes the ZeRO
optimizer keep its master weights and gradients in bf16 (`master_weights_and_grads_dtype`,
runtime/zero/stage_1_and_2.py:336): the step applies a bf16 gradient to bf16 masters, as plain
torch.optim.SGD does on a bf16 model. `deepspeed.utils.safe_get_full_grad(param)` documents "The return data
type is that used for gradient accumulation" (utils/tensor_fragment.py:208), but assembles every ZeRO 1/2
gradient in a float32 buffer (get_full_hp_grad, tensor_fragment.py:106): the gradient a user reads is an
exact float32 copy of the bf16 one the step uses, in another dtype than the one it accumulates and applies.
The values agree (the upcast is exact); only the dtype differs.

Run (CPU, one process on a single-rank gloo group, about 10 s):
python ci/repro/deepspeed_bf16_master_grad_dtype.py
Exit status 1 while safe_get_full_grad's dtype is not the optimizer's gradient dtype, 0 once it is.

Finding: findings/deepspeed_safe_get_full_grad_dtype.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import free_port, init_gloo, set_rank_env  # noqa: E402


def dtypes(deepspeed, stage: int) -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).to(torch.bfloat16)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
           "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=cfg)
    loss = engine(torch.randn(2, 8, dtype=torch.bfloat16)).float().pow(2).sum()
    engine.backward(loss)
    read = {str(deepspeed.utils.safe_get_full_grad(p).dtype) for p in model.parameters()}
    optimizer = str(engine.optimizer.master_weights_and_grads_dtype)
    masters = {str(p.dtype) for p in engine.optimizer.single_partition_of_fp32_groups}
    engine.step()
    engine.destroy()
    return read, optimizer, masters


if __name__ == "__main__":
    os.environ["DS_ACCELERATOR"] = "cpu"
    set_rank_env(0, 1, free_port())
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    init_gloo()
    deepspeed.init_distributed(dist_backend="gloo")
    wrong = False
    for stage in (1, 2):
        read, optimizer, masters = dtypes(deepspeed, stage)
        print(f"ZeRO {stage}, bf16 masters and grads: optimizer master_weights_and_grads_dtype {optimizer}, master "
              f"partitions {sorted(masters)}; safe_get_full_grad dtypes {sorted(read)}")
        wrong |= read != {optimizer}
    dist.destroy_process_group()
    print("WRONG: safe_get_full_grad upcasts the bf16 gradient the step applies" if wrong
          else "safe_get_full_grad returns the optimizer's gradient dtype")
    sys.exit(1 if wrong else 0)
