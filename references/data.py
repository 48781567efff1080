"""Deterministic batches: a pure function of (seed, step, micro-batch, data-parallel rank)."""
from __future__ import annotations

import torch

IGNORE_PATTERNS = ("none", "scattered", "micro", "step")
# "micro": scattered, and every target of micro-batch 0 of step 1 ignored.
# "step": scattered, and every target of every micro-batch of step 2 ignored (a step with no loss).


def make_batch(seed: int, step: int, micro: int, dp_rank: int, *, batch: int, seq: int, vocab: int,
               ignore: str, ignore_index: int = -100, pad_token: int | None = None) -> dict:
    # An explicit mix, not hash(): the stream must not depend on the interpreter.
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step * 10_007 + micro * 101 + dp_rank) % (2**31))
    input_ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    if pad_token is not None:
        # An embedding's padding_idx is exercised only where its token is looked up: twelve random ids
        # from 34 miss it in a third of micro-batches, and a whole run at some seeds (seed 3 never looked
        # token 33 up, so DeepSpeed's dropped padding_idx went unseen there). An assignment, not a draw:
        # the generator's stream, and every case without padding, are unchanged.
        input_ids[-1, 0] = pad_token
    # Targets cover the whole vocabulary range, so every shard owns some of them.
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    labels[0, -1] = vocab - 1  # the last vocabulary row always receives a target
    if ignore not in IGNORE_PATTERNS:
        raise ValueError(f"ignore pattern must be one of {IGNORE_PATTERNS}, got {ignore!r}")
    if ignore != "none":
        mask = torch.rand((batch, seq), generator=gen) < 0.25
        mask[0, 1] = True
        labels = labels.masked_fill(mask, ignore_index)
    if (ignore == "micro" and (step, micro) == (1, 0)) or (ignore == "step" and step == 2):
        labels = torch.full_like(labels, ignore_index)
    return {"input_ids": input_ids, "labels": labels}


def count_items(batches, ignore_index: int = -100) -> int:
    """Non-ignored shifted targets over a whole optimizer step (what HF passes as num_items_in_batch)."""
    return int(sum((b["labels"][..., 1:] != ignore_index).sum() for b in batches))
