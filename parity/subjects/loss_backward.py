"""The ``backward`` axis of the loss-only subjects: how the rank differentiates its loss (once, twice, or with
create_graph and a Hessian-vector product); whatever the library does is recorded (docs/checks.md#decisions)."""
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

