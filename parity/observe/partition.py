"""The suite's own shard-size formula (never the subject's).

Mirrors the documented AutoTP rule for output heads: near-even split, earlier ranks take the
remainder (11 over 2 -> 6, 5); with a grain G > 1 the split is in whole grains and the last rank
takes the leftover rows. The kv-head branch does not apply to heads named lm_head/embed_out.

PyTorch's DTensor ``Shard`` placement splits differently, as ``torch.chunk`` does: every shard but
the trailing ones is ceil(total / parts) wide, so 34 over 4 is 9, 9, 9, 7 (not 9, 9, 8, 8) and
5 over 4 is 2, 2, 1, 0. ``chunk_sizes`` states that rule by this module's own arithmetic; the
claims of a DTensor subject name it (``Claims.split``), so a subject cannot pass by reporting
whatever DTensor did.
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


def chunk_sizes(total: int, parts: int) -> list[int]:
    """torch.chunk's split: ceil-sized leading chunks; the last non-empty one takes the rest, later ones are empty."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    width = -(-total // parts)
    return [max(0, min(width, total - r * width)) for r in range(parts)]


SPLITS = {"near_even": lambda total, parts, grain=1: shard_sizes(total, parts, grain),
          "chunk": lambda total, parts, grain=1: chunk_sizes(total, parts)}


def split_sizes(total: int, parts: int, grain: int = 1, split: str = "near_even") -> list[int]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    return SPLITS[split](total, parts, grain)


def shard_slice(total: int, parts: int, index: int, grain: int = 1, split: str = "near_even") -> slice:
    sizes = split_sizes(total, parts, grain, split)
    start = sum(sizes[:index])
    return slice(start, start + sizes[index])


def mesh_groups(rank: int, world: int, tp: int) -> dict:
    """The suite's own (dp, tp) mesh, as DeepSpeed documents it: TP groups are runs of consecutive
    ranks, a data-parallel group holds one rank of each TP group. -> {"tp_rank", "tp_group", "dp_group"}."""
    if tp < 1 or world % tp:
        raise ValueError(f"world size {world} is not a multiple of tp {tp}")
    tp_rank, dp_rank = rank % tp, rank // tp
    return {"tp_rank": tp_rank, "tp_world": tp, "tp_group": [dp_rank * tp + i for i in range(tp)],
            "dp_group": [tp_rank + k * tp for k in range(world // tp)]}
