"""Dynamic loss scaling as plain PyTorch does it: torch.amp.GradScaler's rule, written out.

The choice and its source (torch 2.x, torch/amp/grad_scaler.py): the loss is multiplied by the scale
before backward; ``unscale_`` divides every gradient by it and notes whether any is inf or nan
(``_amp_foreach_non_finite_check_and_unscale_``); ``step`` skips the optimizer step when one was;
``update`` (``_amp_update_scale_``, aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp) then multiplies
the scale by ``backoff_factor`` (0.5) on such a step and resets its growth tracker, and otherwise
counts the step and multiplies the scale by ``growth_factor`` (2) when the count reaches
``growth_interval``, restarting the count. GradScaler has no hysteresis and no floor.

A DeepSpeed fp16 config maps onto it as a user moving to plain torch would set it:
``init_scale = 2 ** initial_scale_power``, ``growth_interval = loss_scale_window``. The scale is a power
of two, so scaling and unscaling are exact wherever nothing overflows or underflows: on the steps a
scaler applies, the update is the unscaled gradient's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DynamicScaling:
    init_scale: float
    growth_interval: int
    backoff_factor: float = 0.5
    growth_factor: float = 2.0


class ScalerState:
    """The scale and growth tracker GradScaler keeps between steps."""

    def __init__(self, scaling: DynamicScaling):
        self.scaling, self.scale, self.tracker = scaling, float(scaling.init_scale), 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.scaling.backoff_factor
            self.tracker = 0
            return
        self.tracker += 1
        if self.tracker == self.scaling.growth_interval:
            self.scale *= self.scaling.growth_factor
            self.tracker = 0


def any_non_finite(tensors) -> bool:
    return any(not bool(torch.isfinite(t).all()) for t in tensors if t is not None)
