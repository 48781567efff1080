"""The ``backward`` axis of the loss-only subjects: how the rank differentiates its loss.

- once: objective.backward(); records the logits gradient.
- twice: objective.backward(retain_graph=True) twice; autograd accumulates, so the recorded
  gradient must be exactly 2x the single-backward one (the reference does the same).
- create_graph: g = autograd.grad(objective, logits, create_graph=True), then
  autograd.grad(sum(g * v), logits) for the fixed direction v of references/cross_entropy.py
  (this rank's vocabulary columns of it); records g and that Hessian-vector product.

Whatever the library does is what is recorded: an error raised on the way reaches the parent as a
rank error (expected in the case file, or a failure); a gradient without a graph, or a wrong one,
fails the numerical checks.
"""
from __future__ import annotations

import torch

from references.cross_entropy import hvp_direction


def differentiate(objective: torch.Tensor, local: torch.Tensor, backward: str, seed: int, vocab: int, part: slice):
    """Returns (logits gradient, Hessian-vector product or None)."""
    if backward == "once":
        objective.backward()
        return local.grad, None
    if backward == "twice":
        objective.backward(retain_graph=True)
        objective.backward()
        return local.grad, None
    if backward == "create_graph":
        (grad,) = torch.autograd.grad(objective, local, create_graph=True)
        v = hvp_direction(seed, local.shape[0], vocab)[:, part].to(grad.device, grad.dtype)
        (hvp,) = torch.autograd.grad((grad * v).sum(), local)
        return grad, hvp
    raise ValueError(f"unknown backward mode {backward!r}")

