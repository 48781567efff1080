"""DeepSpeed 0.19.8's fp16 dynamic loss-scale schedule against torch.amp.GradScaler's, on one overflow pattern.

Three things, each fed the same per-step overflow flags (step 0 overflows, then whatever the scale gives: a step
overflows iff its scale is at least 2**19, as on the suite's tiny model, cases/deepspeed_loss_scale.toml):

1. loss_scale_window W: DeepSpeed's DynamicLossScaler (ZeRO 1/2/3) grows the scale when
   ``(cur_iter - last_overflow_iter) - 1`` is a positive multiple of W (runtime/fp16/loss_scaler.py,
   update_scale), i.e. after W + 1 clean steps. Its docstring: "Number of consecutive iterations without an
   overflow to wait before increasing the loss scale". torch's GradScaler(growth_interval=W) grows after W
   (``_amp_update_scale_``), as did the Megatron scaler DeepSpeed took (no ``- 1``).
2. hysteresis H (default 2): DeepSpeed keeps the scale at the first overflow and halves it at the H-th, as
   documented ("delay shift"); GradScaler has no hysteresis: one skipped step more per burst, by design.
3. ZeRO 0's FP16_UnfusedOptimizer (and FP16_Optimizer) never read hysteresis: their LossScaleConfig has no such
   field and _update_scale halves at every overflow, so ``hysteresis`` is silently dropped under ZeRO 0.

No fp16 arithmetic runs (CPU, one process on a single-rank gloo group, a few seconds):
python ci/repro/deepspeed_fp16_loss_scale_schedule.py
Exit status 1 while DeepSpeed's window grows a step later than GradScaler's, 0 once they agree.

Finding: findings/deepspeed_fp16_loss_scale_schedule.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import free_port, init_gloo, set_rank_env  # noqa: E402

POWER, OVERFLOWS_FROM, STEPS = 19, 2.0 ** 19, 6


def run(scale_of, update):
    """Per step: the scale it ran under and whether it was skipped."""
    out = []
    for _ in range(STEPS):
        scale = scale_of()
        overflow = scale >= OVERFLOWS_FROM
        out.append((int(scale).bit_length() - 1, "skip" if overflow else "ok"))
        update(overflow)
    return out


def torch_grad_scaler(window):
    scale, tracker = torch.tensor([2.0 ** POWER]), torch.tensor([0], dtype=torch.int32)

    def update(overflow):
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(overflow)]), 2.0, 0.5, window)
    return run(lambda: float(scale), update)


def deepspeed_zero(window, hysteresis):
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(init_scale=2.0 ** POWER, scale_window=window, min_scale=1, delayed_shift=hysteresis,
                               consecutive_hysteresis=False)
    return run(lambda: scaler.cur_scale, scaler.update_scale)


def deepspeed_zero0(window, hysteresis):
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    args = {"init_scale": 2.0 ** POWER, "scale_window": window, "delayed_shift": hysteresis,
            "consecutive_hysteresis": False, "min_scale": 1}  # what DeepSpeedFP16Config.dynamic_loss_scale_args gives
    config = LossScaleConfig(torch.float16, True, 0, args, profile=LossScaleProfile.UNFUSED)
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
    opt = FP16_UnfusedOptimizer(torch.optim.SGD([param], lr=0.1), loss_scale_config=config, verbose=False)
    return run(lambda: opt.loss_scale, opt._update_scale)


def show(name, steps):
    print(f"{name:50s}" + "  ".join(f"s{i}:2^{p} {what}" for i, (p, what) in enumerate(steps)))


if __name__ == "__main__":
    os.environ["DS_ACCELERATOR"] = "cpu"
    set_rank_env(0, 1, free_port())
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    init_gloo()
    deepspeed.init_distributed(dist_backend="gloo")
    torch_w2, zero_w2 = torch_grad_scaler(2), deepspeed_zero(2, 1)
    show("torch GradScaler, growth_interval 2", torch_w2)
    show("DeepSpeed ZeRO 1/2, window 2, hysteresis 1", zero_w2)
    show("DeepSpeed ZeRO 0 (unfused), window 2, hyst. 1", deepspeed_zero0(2, 1))
    show("torch GradScaler, growth_interval 1000", torch_grad_scaler(1000))
    show("DeepSpeed ZeRO 1/2, window 1000, hysteresis 2", deepspeed_zero(1000, 2))
    zero0_h2 = deepspeed_zero0(1000, 2)
    show("DeepSpeed ZeRO 0 (unfused), window 1000, hyst. 2", zero0_h2)
    dist.destroy_process_group()
    late = [s for s, (_, w) in enumerate(zero_w2) if w == "skip"] != [s for s, (_, w) in enumerate(torch_w2) if w == "skip"]
    print("WRONG: DeepSpeed's window grows the scale one clean step later than GradScaler's (and its docstring)"
          if late else "DeepSpeed's window grows as GradScaler's does")
    if [w for _, w in zero0_h2].count("skip") == 1:
        print("and ZeRO 0's optimizer halved at the first overflow: hysteresis 2 was ignored")
    sys.exit(1 if late else 0)
