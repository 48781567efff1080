"""DeepSpeed 0.19.8: fp16 with a dynamic loss scale under ZeRO 0 divides every update by the scale.

`engine.backward(loss)` multiplies the loss by the loss scale only when the optimizer is a ZeROOptimizer
(runtime/engine.py:3417, `self.optimizer.scale_if_loss(loss)`; `engine.scale` alike). Under ZeRO 0 an fp16
engine wraps a torch optimizer in FP16_UnfusedOptimizer (FusedAdam: FP16_Optimizer), which is not one, so the
loss goes backward unscaled, and FP16_UnfusedOptimizer.step still divides every gradient by its current scale
(`unscale_and_clip_grads`). With `loss_scale: 0` (dynamic, the fp16 section's default) the scale starts at
2**initial_scale_power (default 16): each update is 65536 times too small, no gradient ever overflows, no step is
skipped, and the scale only grows. Nothing is logged. ZeRO 1 scales the loss and applies the plain update.
A static `loss_scale: 1.0` hides it. Upstream: DeepSpeed PR #8393 (open).

Run (CPU with oneDNN fp16, i.e. AVX-512 FP16 / AMX-FP16; one process on a single-rank gloo group, about 10 s):
python ci/repro/deepspeed_fp16_zero0_loss_not_scaled.py
Exit status 1 while ZeRO 0's update is off by the loss scale, 0 once it matches plain SGD; 2 where this CPU has
no oneDNN fp16 (DeepSpeed's CPU accelerator then refuses fp16).

Finding: findings/deepspeed_fp16_zero0_loss_not_scaled.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import free_port, init_gloo, set_rank_env  # noqa: E402

LR = 0.1


def update_ratio(deepspeed, stage: int) -> tuple:
    """(DeepSpeed's weight change / plain SGD's, the loss scale, engine.skipped_steps) after one step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to(torch.float16)
    x = torch.randn(8, 16, dtype=torch.float16)
    plain = torch.nn.Linear(16, 4)
    plain.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    plain(x.float()).float().pow(2).mean().backward()
    want = LR * plain.weight.grad
    before = model.weight.detach().float().clone()
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
           "fp16": {"enabled": True, "loss_scale": 0}}  # dynamic, initial_scale_power 16: DeepSpeed's defaults
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=LR), config=cfg)
    scale = float(engine.optimizer.loss_scale)
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()
    got = before - deepspeed.utils.safe_get_full_fp32_param(model.weight).float() if stage else \
        before - engine.optimizer.fp32_groups[0][0].detach().float()
    ratio = float(got.norm() / want.norm())
    skipped = engine.skipped_steps
    engine.destroy()
    return ratio, scale, skipped


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
    found = {stage: update_ratio(deepspeed, stage) for stage in (0, 1)}
    dist.destroy_process_group()
    for stage, (ratio, scale, skipped) in found.items():
        print(f"fp16, dynamic loss scale {scale:g}, ZeRO {stage}: update / plain SGD's = {ratio:.3e}, "
              f"skipped steps {skipped}")
    wrong = abs(found[0][0] - 1) > 0.01
    print(f"WRONG: ZeRO 0's update is {1 / found[0][0]:.4g} times too small (the loss was never scaled, the "
          "gradient was unscaled all the same)" if wrong else "ZeRO 0's update is plain SGD's")
    sys.exit(1 if wrong else 0)
