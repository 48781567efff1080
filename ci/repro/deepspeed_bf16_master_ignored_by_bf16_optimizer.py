"""DeepSpeed 0.19.8: `bf16_master_weights_and_grads` is dropped without a word when the config also selects
BF16_Optimizer (bf16 weights, `data_types.grad_accum_dtype: fp32`, ZeRO 1).

`bf16: {bf16_master_weights_and_grads: true, bf16_optimizer_states: true}` asks for bf16 master weights and
gradients (runtime/precision_config.py: "Maintain master weights/gradients in bf16 precision for ZeRO
optimizer"); ZeRO 0 refuses it (runtime/config.py: "only supported with ZeRO Stage 1, 2, or 3"), ZeRO 2 honours it
(the ZeRO optimizer's master_weights_and_grads_dtype is bfloat16). With fp32 gradient accumulation under ZeRO 1,
engine._do_optimizer_sanity_check returns BFLOAT16 before the switch is looked at, and BF16_Optimizer
(runtime/bf16_optimizer.py) never reads it: the masters and the gradients the step applies are float32, every
sub-unit update is kept, and nothing says the request was not met. The request is contradictory (fp32 gradient
accumulation, bf16 gradients); DeepSpeed neither refuses it nor tells which half it kept.

Run (CPU, one process on a single-rank gloo group, about 10 s):
python ci/repro/deepspeed_bf16_master_ignored_by_bf16_optimizer.py
Exit status 1 while ZeRO 1 accepts the switch and keeps float32 masters, 0 once it refuses or honours it.

Finding: findings/deepspeed_bf16_master_ignored_by_bf16_optimizer.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import free_port, init_gloo, set_rank_env  # noqa: E402


def masters(deepspeed, stage: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).to(torch.bfloat16)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
           "data_types": {"grad_accum_dtype": "fp32"},
           "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=cfg)
    except Exception as error:  # a refusal is the other acceptable answer
        return f"refused: {type(error).__name__}: {error}", None
    optimizer = engine.optimizer
    flat = getattr(optimizer, "single_partition_of_fp32_groups", None) or getattr(optimizer, "fp32_groups_flat_partition")
    found = type(optimizer).__name__, {str(p.dtype) for p in flat}
    engine.destroy()
    return found


if __name__ == "__main__":
    os.environ["DS_ACCELERATOR"] = "cpu"
    set_rank_env(0, 1, free_port())
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    init_gloo()
    deepspeed.init_distributed(dist_backend="gloo")
    by_stage = {stage: masters(deepspeed, stage) for stage in (1, 2)}
    for stage, (optimizer, dtypes) in by_stage.items():
        print(f"ZeRO {stage}, bf16 + grad_accum fp32 + bf16_master_weights_and_grads: {optimizer}, master partitions "
              f"{sorted(dtypes) if dtypes else '-'}")
    dist.destroy_process_group()
    ignored = by_stage[1][1] == {"torch.float32"}
    print("IGNORED: ZeRO 1 accepts bf16_master_weights_and_grads and keeps float32 masters" if ignored
          else "ZeRO 1 refuses or honours the switch")
    sys.exit(1 if ignored else 0)
