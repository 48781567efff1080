"""DeepSpeed 0.19.8: under ZeRO 1/2 with fp16, a step on which the dynamic loss scale grows applies half its update.

DeepSpeedZeroOptimizer.step (runtime/zero/stage_1_and_2.py) calls ``self._update_scale(self.overflow)`` before
``unscale_and_clip_grads``, which divides the gradients by ``self.loss_scale``: on a clean step at which the scale
grows (every loss_scale_window + 1 clean steps), the gradient scaled by S in backward is divided by 2 S. The
reported norm is divided by ``prev_scale`` (the fix of DeepSpeed PR #2695); the gradients are not. Unless gradient
clipping binds (its coefficient then carries the same scale on both sides), that step's update is half the
gradient's, silently. torch's GradScaler unscales with the scale the backward used, then updates it. (The ZeRO 0
optimizers share the order: noted in DeepSpeed PR #8588's discussion for FP16_Optimizer.)

Here loss_scale_window 1: DeepSpeed grows the scale on every clean step from the second on, and every step's
update is measured against lr times the gradient (safe_get_full_grad divided by the scale the backward used).

Run (CPU with oneDNN fp16; one process on a single-rank gloo group, about 10 s):
python ci/repro/deepspeed_zero_fp16_growth_step_half_update.py
Exit status 1 while a growth step's update is off, 0 once every update is lr times the gradient; 2 where this CPU
has no oneDNN fp16.

Finding: findings/deepspeed_zero_fp16_growth_step_half_update.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import free_port, init_gloo, set_rank_env  # noqa: E402

LR = 0.1


def update_ratios(deepspeed, stage: int) -> list:
    """Per step: (scale the backward used, scale after the step, update / (lr * gradient))."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to(torch.float16)
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
           "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 4, "loss_scale_window": 1,
                    "hysteresis": 1}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=LR), config=cfg)
    found = []
    for _ in range(4):
        before = safe_get_full_fp32_param(model.weight).clone()
        scale = float(engine.optimizer.loss_scale)
        engine.backward(engine(torch.randn(8, 16, dtype=torch.float16)).float().pow(2).mean())
        grad = safe_get_full_grad(model.weight).float() / scale
        engine.step()
        moved = before - safe_get_full_fp32_param(model.weight)
        found.append((scale, float(engine.optimizer.loss_scale), float(moved.norm() / (LR * grad).norm())))
    engine.destroy()
    return found


if __name__ == "__main__":
    try:
        fp16 = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # noqa: BLE001 - no way to ask: treat as missing
        fp16 = False
    if not fp16:
        print("this CPU has no oneDNN fp16: DeepSpeed's CPU accelerator refuses fp16 engines; run it on one that has")
        sys.exit(2)
    os.environ["DS_ACCELERATOR"] = "cpu"
    set_rank_env(0, 1, free_port())
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    init_gloo()
    deepspeed.init_distributed(dist_backend="gloo")
    wrong = False
    for stage in (1, 2):
        for step, (scale, after, ratio) in enumerate(update_ratios(deepspeed, stage)):
            print(f"ZeRO {stage} step {step}: backward scale {scale:g}, after the step {after:g}: "
                  f"update / (lr * gradient) = {ratio:.4f}")
            wrong |= abs(ratio - 1) > 0.01
    dist.destroy_process_group()
    print("WRONG: a step on which the scale grew applied half its gradient" if wrong
          else "every update is lr times the gradient")
    sys.exit(1 if wrong else 0)
