"""Reference for loss-only subjects: cross entropy of given logits, and its gradient.

The upstream gradient is a fixed positive weight per token (not all ones), so a subject that
ignores grad_output, or applies it to the wrong token, is caught.
"""
from __future__ import annotations

import torch

from references.loss import token_losses
from references.trajectory import Trajectory


def ce_inputs(seed: int, tokens: int, vocab: int, ignore: str, dtype: torch.dtype, ignore_index: int = -100):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(tokens, vocab, generator=gen)).to(dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    targets[0] = vocab - 1
    if ignore == "scattered":
        targets = targets.masked_fill(torch.rand(tokens, generator=gen) < 0.25, ignore_index)
        targets[1] = ignore_index
    upstream = torch.rand(tokens, generator=gen) + 0.5
    return logits, targets, upstream


def ce_reference(seed: int, tokens: int, vocab: int, ignore: str, case_dtype: torch.dtype,
                 compute_dtype: torch.dtype | None = None, ignore_index: int = -100) -> Trajectory:
    logits, targets, upstream = ce_inputs(seed, tokens, vocab, ignore, case_dtype, ignore_index)
    x = logits.to(compute_dtype or case_dtype).requires_grad_(True)
    loss = token_losses(x, targets, ignore_index)
    (loss * upstream.to(loss.dtype)).sum().backward()
    traj = Trajectory()
    traj.put("loss", 0, 0, 0, None, loss)
    traj.put("logits_grad", 0, 0, 0, None, x.grad)
    traj.put("logits_after", 0, 0, 0, None, logits)  # the input, as it was before the call
    return traj
