"""The precision of the operands of the matrix products a call runs, seen at the dispatcher.

Under autocast a low-precision GEMM and a float32 one can give numbers within the same bounds (a loss within bf16's
of plain autocast's either way), so the numbers alone cannot show that the autocast dtype reached a subject that
reads it itself (DeepSpeed's fused linear CE turns autocast off inside and casts by hand). A dispatch mode sees every
aten matrix product below autograd and autocast, forward and backward, whoever issued it.

An operand counts as the dtype it has, except that a float32 operand whose every value the expected low-precision
dtype holds exactly counts as that dtype: a float32 product of upcast bf16 values (DeepSpeed's fused CE accumulates
the hidden gradient so where the CPU has no mixed-dtype GEMM, linear_cross_entropy.py:68) rounds its operands to
bf16 all the same. What it must not see is a float32 operand with values bf16 does not have.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten op -> the positions of its two matrix operands (addmm's first argument is the added term).
_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "addmm_": (1, 2), "baddbmm": (1, 2), "baddbmm_": (1, 2)}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class _GemmDtypes(TorchDispatchMode):
    def __init__(self, seen: set, expected: torch.dtype):
        super().__init__()
        self.seen, self.expected = seen, expected

    def precision(self, operand: torch.Tensor) -> str:
        if operand.dtype == torch.float32 and torch.equal(operand.to(self.expected).to(torch.float32), operand):
            return _name(self.expected)
        return _name(operand.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        positions = _OPERANDS.get(func.overloadpacket.__name__)
        if positions is not None:
            self.seen.update(self.precision(args[i]) for i in positions)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recording(expected: torch.dtype):
    """Yields a set that collects the precision (module docstring) of every matrix product's operands run inside
    the block, a float32 operand judged against ``expected``."""
    seen: set = set()
    with _GemmDtypes(seen, expected):
        yield seen
