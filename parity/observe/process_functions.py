"""Which process-wide torch functions a case's model runs: torch's own, or what a framework put in their place.

DeepSpeed's zero.Init (ZeRO 3) replaces torch.nn.functional.linear with its zero3_linear_wrap and
leaves it there after the engine is destroyed (ci/repro/deepspeed_zero3_linear_persists.py): every
model built later in the process runs it. The harness puts torch's back before each case
(parity/harness/rank_worker.py); a case that takes the user's path (the ``process`` axis) records what
its model ran, and the comparison holds it to torch's.
"""
from __future__ import annotations

import torch


def function_name(function) -> str:
    return f"{getattr(function, '__module__', None)}.{getattr(function, '__name__', repr(function))}"


# What torch.nn.functional holds in an untouched process, by name: what a rank puts back before every
# case (parity/harness/rank_worker.py restore_process_globals) and what a case's model must have run.
TORCH_FUNCTIONAL = {"linear": torch._C._nn.linear}
TORCH_LINEAR = function_name(TORCH_FUNCTIONAL["linear"])


def functional_linear() -> str:
    """The name of what torch.nn.functional.linear is in this process now."""
    return function_name(torch.nn.functional.linear)
