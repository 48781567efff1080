"""The suite's own shard-size formula (never the subject's).

Mirrors the documented AutoTP rule for output heads: near-even split, earlier ranks take the
remainder (11 over 2 -> 6, 5); with a grain G > 1 the split is in whole grains and the last rank
takes the leftover rows. The kv-head branch does not apply to heads named lm_head/embed_out.
"""
from __future__ import annotations


def shard_sizes(total: int, parts: int, grain: int = 1) -> list[int]:
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if grain > 1 and total >= grain:
        grains, leftover = divmod(total, grain)
        sizes = [(grains // parts + (r < grains % parts)) * grain for r in range(parts)]
        sizes[-1] += leftover
        return sizes
    return [total // parts + (r < total % parts) for r in range(parts)]


def shard_slice(total: int, parts: int, index: int, grain: int = 1) -> slice:
    sizes = shard_sizes(total, parts, grain)
    start = sum(sizes[:index])
    return slice(start, start + sizes[index])
