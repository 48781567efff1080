"""Initial weights drawn from torch's global generator, one model at a time per process; and the mark
on what a reference makes as its exact inputs (exact_inputs).

nn.Module constructors draw from the global generator and take none of their own. A reference may be
computed in a thread beside another that builds a model (the Runner's reference thread; `parity run
-j N` once ran N such threads in one process), and two models seeded at once would interleave their
draws and get weights that depend on timing (seen on the 16-core H200 host: initial_weight failures
that moved from run to run). The lock makes a seeded construction atomic with respect to every other
seeded construction; the generator's state is restored afterwards so callers see no side effect.
"""
from __future__ import annotations

import contextlib
import threading

import torch

_GLOBAL_GENERATOR = threading.Lock()
_making = threading.local()


@contextlib.contextmanager
def exact_inputs():
    """Marks the making of a reference's inputs: initial weights, logits, hidden states, targets.

    A subject receives these values exactly (the suite hands it the same draws, cast to the case
    dtype once), so their own rounding is not an error a correct subject can make. Whoever reruns a
    reference with other roundings (parity's rounding samples) leaves what is made in here alone."""
    _making.depth = getattr(_making, "depth", 0) + 1
    try:
        yield
    finally:
        _making.depth -= 1


def making_inputs() -> bool:
    """True inside exact_inputs() on this thread."""
    return getattr(_making, "depth", 0) > 0


@contextlib.contextmanager
def seeded(seed: int):
    """A model built in here draws its initial weights from ``seed`` (and they are exact inputs)."""
    with _GLOBAL_GENERATOR, exact_inputs():
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            yield
        finally:
            torch.random.set_rng_state(state)
