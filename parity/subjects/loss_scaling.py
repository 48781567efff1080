"""fp16 dynamic loss scaling on the engine heads: the loss_scale axis names a DeepSpeed fp16 section, held to
DeepSpeed's documented schedule and torch's GradScaler (docs/subjects.md#fp16-dynamic-loss-scaling)."""
from __future__ import annotations

from dataclasses import dataclass

from references.grad_scaler import DynamicScaling


@dataclass(frozen=True)
class DynamicSetting:
    power: int  # initial_scale_power
    window: int  # loss_scale_window
    hysteresis: int
    # The smallest power of two at which this case's model overflows fp16 on every step
    # (docs/subjects.md#fp16-dynamic-loss-scaling).
    overflows_from: int = 19


LOSS_SCALES = {
    "static": None,
    # hysteresis 1: halve on every overflow, as GradScaler; the default window (1000) never grows in 5 steps.
    "dyn19_h1": DynamicSetting(power=19, window=1000, hysteresis=1),
    # a window of 2: the scale grows back to 2**19 inside the run, and overflows again there.
    "dyn19_h1_w2": DynamicSetting(power=19, window=2, hysteresis=1),
    # DeepSpeed's default hysteresis (2): the first overflow keeps the scale, the second halves it.
    "dyn19": DynamicSetting(power=19, window=1000, hysteresis=2),
    # from 2**10, growing after every clean step: never near an overflow (2**14 at most), so nothing is skipped.
    "dyn10_w1": DynamicSetting(power=10, window=1, hysteresis=1),
}
# Where the overflow threshold of overflows_from was measured: a dynamic value elsewhere proves nothing.
DESIGNED_POINT = {"dtype": "fp16", "vocab": 34, "hidden": 32, "reduction": "mean", "bias": True, "clip": 0.0,
                  "gas": 2, "seed": 0, "ignore": "scattered"}


def setting(values: dict) -> DynamicSetting | None:
    return LOSS_SCALES[values.optional("loss_scale", "static")]


def invalid_reason(values: dict) -> str | None:
    if setting(values) is None:
        return None
    off = {k: values[k] for k, v in DESIGNED_POINT.items() if values[k] != v}
    if off:
        return (f"loss_scale {values['loss_scale']!r} is designed for {DESIGNED_POINT} (where the first step must "
                f"overflow fp16); these values differ: {off}")
    return None


def fp16_section(values: dict) -> dict:
    found = setting(values)
    if found is None:
        # A static scale of 1: the numbers of every other fp16 case, far from fp16's range limits.
        return {"enabled": True, "loss_scale": 1.0}
    return {"enabled": True, "loss_scale": 0, "initial_scale_power": found.power,
            "loss_scale_window": found.window, "hysteresis": found.hysteresis}


# torch_autocast float16: DeepSpeed's GradScaler at its defaults, as a user's AMP loop
# (docs/subjects.md#fp16-dynamic-loss-scaling).
AUTOCAST_FP16_SCALING = DynamicScaling(init_scale=2.0 ** 16, growth_interval=2000)


def autocast_grad_scaler(values: dict) -> DynamicScaling | None:
    """The GradScaler a torch_autocast float16 engine (and the user's fp16 AMP loop) scales with; None otherwise."""
    return AUTOCAST_FP16_SCALING if values.optional("autocast", "off") == "fp16" else None


def autocast_scaler(engine):
    """The torch.amp.GradScaler a torch_autocast float16 engine built: the engine's own without ZeRO, the ZeRO
    optimizer's otherwise."""
    return engine.torch_autocast_z0_gradscaler or getattr(engine.optimizer, "torch_autocast_gradscaler", None)


def grad_scaler(values: dict) -> DynamicScaling | None:
    """What a user moving this config to plain torch sets on torch.amp.GradScaler (no hysteresis there)."""
    found = setting(values)
    return None if found is None else DynamicScaling(init_scale=2.0 ** found.power, growth_interval=found.window)


def documented(found: DynamicSetting, steps: int) -> dict:
    """DeepSpeed's schedule as its documentation states it (docs/subjects.md#fp16-dynamic-loss-scaling); a step
    overflows iff its scale is at least 2**overflows_from."""
    scale, left, clean = 2.0 ** found.power, found.hysteresis, 0
    scales, skipped = [], []
    for step in range(steps):
        scales.append(scale)
        if scale >= 2.0 ** found.overflows_from:
            skipped.append(step)
            clean = 0
            if left <= 1:
                scale = max(scale / 2, 1.0)
            else:
                left -= 1
            continue
        clean += 1
        if clean == found.window:
            scale, left, clean = scale * 2, found.hysteresis, 0
    return {"loss_scales": scales, "skipped": skipped, "skipped_steps": len(skipped)}


def current_scale(engine) -> float:
    """The scale the next backward multiplies the loss by (FP16_UnfusedOptimizer and ZeRO's optimizer both
    expose it as ``loss_scale``)."""
    return float(engine.optimizer.loss_scale)


def step_overflowed(engine) -> bool:
    """Whether the rank's optimizer skipped the step it just took (the flag engine._take_model_step reads)."""
    return bool(getattr(engine.optimizer, "overflow", False))
