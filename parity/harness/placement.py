"""Where a rank runs and how it talks: one rank per GPU over NCCL, or ranks sharing cuda:0 over gloo.

NCCL refuses two ranks on one GPU (ncclInvalidUsage); gloo moves CUDA tensors fine, so with fewer
GPUs than ranks every rank uses cuda:0 over gloo (shared/notes/liger-and-gpu.md). The parity ranks
and the bench ranks both place themselves here, so a figure and a verdict name the same mode.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda:N"
    backend: str  # torch.distributed backend
    mode: str  # how the ranks ran, as reports print it
    local_index: int | None = None  # the CUDA device this rank uses


def place_rank(rank: int, world_size: int, device: str) -> Placement:
    if device == "cpu":
        return Placement("cpu", "gloo", "cpu ranks over gloo")
    import torch

    gpus = torch.cuda.device_count()
    if gpus >= world_size:
        return Placement(f"cuda:{rank}", "nccl", f"one rank per GPU over nccl ({gpus} GPUs)", rank)
    return Placement("cuda:0", "gloo", f"{world_size} ranks sharing cuda:0 over gloo ({gpus} GPU(s))", 0)


def use_placement(placement: Placement) -> None:
    """Take the rank's CUDA device; DeepSpeed reads LOCAL_RANK for it too."""
    if placement.local_index is not None:
        import torch

        torch.cuda.set_device(placement.local_index)
        os.environ["LOCAL_RANK"] = str(placement.local_index)
