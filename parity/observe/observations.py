"""What a rank reports about one case: recorded tensors and facts, as plain picklable data.

Tensors travel as float64 numpy arrays (exact for bf16/fp16/fp32 values; the shape is kept) tagged
with their original dtype and device, so no torch shared-memory handles cross process boundaries and
the parent can still hold each tensor to the reference's precision and placement
(parity/checks/contract.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from parity.observe.records import record_kind


@dataclass
class RankObservations:
    rank: int
    tp_rank: int
    dp_rank: int
    # (kind, step, micro, name) -> float64 array; kinds: parity/observe/records.py.
    tensors: dict = field(default_factory=dict)
    dtypes: dict = field(default_factory=dict)
    devices: dict = field(default_factory=dict)  # same keys -> str(torch.device) the tensor was on
    # facts: module types, backend that ran per micro-batch, process state at case start, ...
    facts: dict = field(default_factory=dict)

    def record(self, kind: str, step: int, micro, name, tensor: torch.Tensor, unscale: float = 1.0) -> None:
        """``unscale``: a loss scale (a power of two) the tensor holds, divided out of the float64 copy, where
        the division is exact whatever the tensor's dtype; the dtype kept is the tensor's own."""
        record_kind(kind)  # a kind the record schema does not declare is a subject's bug: raise
        key = (kind, step, micro, name)
        self.tensors[key] = tensor.detach().to("cpu", torch.float64).numpy().copy()
        if unscale != 1.0:
            self.tensors[key] /= unscale
        self.dtypes[key] = str(tensor.dtype).replace("torch.", "")
        self.devices[key] = str(tensor.device)

    def get(self, kind, step, micro, name) -> np.ndarray | None:
        return self.tensors.get((kind, step, micro, name))
