"""Stage-local float64 oracles: one stage of a head's training step, re-evaluated in float64 on the
inputs the subject itself recorded for that stage (not on a whole float64 trajectory, which at
production shapes would be too slow and too big).

Plain PyTorch only (no framework under test). Every function works on whatever device its inputs
live on (the GPU at scale) and on row chunks, so a caller never holds a full float64 logits
tensor; the cross-rank parts of a vocabulary-parallel softmax are returned as partial statistics
(a row max, a sum of exponentials, a target logit) that the caller combines over its TP group
with ordinary all-reduces, as any vocabulary-sharded softmax must.
"""
from __future__ import annotations

import torch

F64 = torch.float64


def linear64(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) in float64: the logits stage (head input -> logits)."""
    out = x.to(F64) @ weight.to(F64).T
    return out if bias is None else out + bias.to(F64)


def abs_linear64(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """|x| @ |weight|.T in float64: the magnitude a matmul's rounding error is bounded relative to."""
    return x.to(F64).abs() @ weight.to(F64).abs().T


def row_max64(z: torch.Tensor) -> torch.Tensor:
    return z.to(F64).amax(dim=-1)


def row_sum_exp64(z: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """sum_j exp(z_ij - m_i) over this rank's columns, m the (global) row max."""
    return torch.exp(z.to(F64) - row_max.unsqueeze(-1)).sum(dim=-1)


def target_logit64(z: torch.Tensor, targets: torch.Tensor, start: int, ignore_index: int) -> torch.Tensor:
    """z[i, target_i - start] where this rank's columns [start, start + width) hold the target, else 0."""
    width = z.shape[-1]
    local = targets - start
    mine = (targets != ignore_index) & (local >= 0) & (local < width)
    picked = z.to(F64).gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
    return torch.where(mine, picked, torch.zeros_like(picked))


def softmax_grad64(z: torch.Tensor, targets: torch.Tensor, start: int, lse: torch.Tensor, scale: torch.Tensor,
                   ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d(loss)/d(z) of a CE, float64, for this rank's columns: (softmax - onehot) * scale per row
    (scale = 1/N for a mean over N counted tokens, 0 on ignored rows); also the softmax itself."""
    p = torch.exp(z.to(F64) - lse.unsqueeze(-1))
    g = p.clone()
    width = z.shape[-1]
    local = targets - start
    mine = (targets != ignore_index) & (local >= 0) & (local < width)
    rows = torch.nonzero(mine).squeeze(-1)
    g[rows, local[rows]] -= 1.0
    return g * scale.unsqueeze(-1), p


def sgd64(weight: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
    """One plain SGD step (no momentum, no weight decay) in float64: the update stage."""
    return weight.to(F64) - lr * grad.to(F64)
