"""Causal-shift cross entropy, written out from its definition.

Logits are upcast to float32 (or kept at float64 for the oracle) before the softmax, which is
what HF models and DeepSpeed's vocabulary-parallel CE both do. The shift follows HF:
logits[..., :-1, :] predict labels[..., 1:].
"""
from __future__ import annotations

import torch

REDUCTIONS = ("none", "sum", "mean", "num_items")


def token_losses(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                 label_smoothing: float = 0.0) -> torch.Tensor:
    """-log softmax(logits)[target] per token, 0 where the target is ignored (computed, not looked up in torch's CE).

    label_smoothing = a follows torch's F.cross_entropy: (1 - a) * nll + a * mean over the whole
    vocabulary of -log p_i (the target spread a/V over every class, the true one included)."""
    compute = logits if logits.dtype == torch.float64 else logits.float()
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    row_max = compute.max(dim=-1, keepdim=True).values.detach()
    shifted = compute - row_max
    log_norm = shifted.exp().sum(dim=-1).log()
    picked = shifted.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    losses = log_norm - picked
    if label_smoothing:
        # -log p_i = log_norm - shifted_i, so its mean over the vocabulary is log_norm - mean(shifted).
        losses = (1 - label_smoothing) * losses + label_smoothing * (log_norm - shifted.mean(dim=-1))
    return torch.where(valid, losses, torch.zeros_like(log_norm))


def token_logprobs(logits: torch.Tensor, index: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """log softmax(logits) at each of the ``k`` ids of ``index`` [..., k] over the whole vocabulary, upcast to
    float32 as token_losses is, 0 where an id is ignore_index: a user's log_softmax(full).gather(-1, index)
    (a teacher's top-k ids in sparse distillation)."""
    compute = logits if logits.dtype == torch.float64 else logits.float()
    valid = index != ignore_index
    log_p = compute - compute.logsumexp(dim=-1, keepdim=True)
    picked = log_p.gather(-1, torch.where(valid, index, torch.zeros_like(index)))
    return torch.where(valid, picked, torch.zeros_like(picked))


def token_entropies(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of softmax(logits) per token, -sum_i p_i log p_i over the whole vocabulary, upcast to
    float32 as token_losses is: what plain torch gives a user who computes it from the full logits
    (torch.distributions.Categorical(logits=logits.float()).entropy(), and the RL libraries'
    entropy_from_logits, which use this form)."""
    compute = logits if logits.dtype == torch.float64 else logits.float()
    log_p = compute - compute.logsumexp(dim=-1, keepdim=True)
    return -(log_p.exp() * log_p).sum(dim=-1)


def continued_shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Pre-shifted labels as a caller hands them to HF's loss (``shift_labels``): position t's target is
    labels[t + 1], and the last position's is a real one, the row's first label (a stand-in for the next
    window's first token, which sequence-parallel chunks and packed streams carry there), not the ignored pad
    HF's own shift puts there. A loss that drops shift_labels and shifts ``labels`` itself so loses a target."""
    return labels.roll(-1, dims=-1)


def causal_lm_loss(logits, labels, reduction="mean", ignore_index=-100, num_items_in_batch=None, label_smoothing=0.0,
                   shift_labels=None):
    """reduction: none -> per-token losses [B, T-1]; sum; mean over non-ignored tokens;
    num_items -> sum / num_items_in_batch (HF Trainer's token-count normalisation).

    shift_labels: transformers' ForCausalLMLoss (5.24, loss/loss_utils.py) takes them as given, without shifting:

        if shift_labels is None:
            labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, vocab_size)
        shift_labels = shift_labels.view(-1)
        loss = fixed_cross_entropy(logits, shift_labels, num_items_in_batch, ignore_index, **kwargs)

    so every position's logits [B, T, V] are scored against shift_labels [B, T] (``labels`` unused), and the
    mean counts the non-ignored shift_labels; per-token losses are then [B, T]."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if shift_labels is None:
        scored, targets = logits[..., :-1, :], labels[..., 1:]
    else:
        scored, targets = logits, shift_labels
    losses = token_losses(scored, targets, ignore_index, label_smoothing)
    if reduction == "none":
        return losses
    total = losses.sum()
    if reduction == "sum":
        return total
    if reduction == "num_items":
        # transformers' fixed_cross_entropy (loss/loss_utils.py): F.cross_entropy(reduction="sum") /
        # num_items_in_batch, unguarded: a step whose targets are all ignored gives 0/0 = nan.
        return total / int(num_items_in_batch)
    count = (targets != ignore_index).sum()
    # torch's F.cross_entropy(reduction="mean") (what HF's ForCausalLMLoss calls) over targets that are
    # all ignore_index returns 0/0 = nan, with a zero gradient: so does this (the zero numerator's
    # gradient reaches no logit, every token being masked). Not 0: that is DeepSpeed's choice, a
    # documented divergence (docs/findings.md#deepspeed_ce_all_ignored_is_zero), not what a user without TP gets.
    return total / count
