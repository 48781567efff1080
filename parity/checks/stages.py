"""Stage-local oracles: one stage of a training step re-evaluated on the subject's own inputs to it.

An end-to-end comparison inherits every rounding upstream of the quantity compared (after a few
SGD steps in bf16 the subject's weights, and so its logits, differ from the reference's by many
roundings), so its bound must allow for them and a small error made in the stage itself hides
under them. Here the subject's recorded stage inputs are taken as exact, and the stage is done
twice by the reference's code (references/loss.py: plain torch, no framework under test): at the
case dtype, as an unsharded user's run would do it, and in float64 (the stage oracle). The
subject's stage output is then held to the stage reference's own error on those very inputs.

Stages:
- logits, targets -> loss (the CE computes in float32 from upcast logits: floor float32).
- logits, targets, head weight -> head-input gradient: the CE's logits gradient at the case dtype,
  times the head weight (Linear's backward, a case-dtype matmul).
- gradient -> SGD update is parity.checks.compare's sgd_update (w' = w - lr g on the rank's own
  values).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch

from references.loss import causal_lm_loss


def _objective(loss: torch.Tensor, reduction: str, micro_batches: int) -> torch.Tensor:
    # references.trajectory: reduction "none" backpropagates the sum, every loss is divided by GAS.
    return (loss.sum() if reduction == "none" else loss) / micro_batches


# The stage reference is a pure function of its inputs; `parity sensitivity` judges one case's
# observations many times with most stage inputs unchanged, so recent results are kept, keyed by the
# inputs' bytes.
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 512
_LOCK = threading.Lock()  # parity run -j judges cases in threads


def loss_and_head_input_grad(logits, labels, weight, spec, num_items, micro_batches, dtype):
    """The loss and (with ``weight``, the full [V, H] head weight) the head-input gradient [..., H]
    computed from these logits [B, T, V] in ``dtype`` the reference's way. float64 is the oracle."""
    key = (logits.tobytes(), logits.shape, labels.numpy().tobytes(), None if weight is None else weight.tobytes(),
           spec, num_items, micro_batches, dtype)
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    result = _compute(logits, labels, weight, spec, num_items, micro_batches, dtype)
    with _LOCK:
        _CACHE[key] = result
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return result


def _compute(logits: np.ndarray, labels: torch.Tensor, weight: np.ndarray | None, spec,
             num_items: int, micro_batches: int, dtype: torch.dtype):
    z = torch.from_numpy(logits).to(dtype).requires_grad_(weight is not None)
    loss = causal_lm_loss(z, labels, reduction=spec.reduction, ignore_index=spec.ignore_index,
                          num_items_in_batch=num_items if spec.reduction == "num_items" else None)
    head_input_grad = None
    if weight is not None:
        _objective(loss, spec.reduction, micro_batches).backward()
        w = torch.from_numpy(weight).to(dtype)
        head_input_grad = (z.grad.reshape(-1, z.shape[-1]) @ w).detach().double().numpy()
    return loss.detach().double().numpy(), head_input_grad
