"""Initial weights drawn from torch's global generator, one model at a time per process.

nn.Module constructors draw from the global generator and take none of their own. `parity run -j N`
computes references in N threads of the parent, so two models seeded at once would interleave their
draws and get weights that depend on timing (seen on the 16-core H200 host: initial_weight failures
that moved from run to run). The lock makes a seeded construction atomic with respect to every other
seeded construction; the generator's state is restored afterwards so callers see no side effect.
"""
from __future__ import annotations

import contextlib
import threading

import torch

_GLOBAL_GENERATOR = threading.Lock()


@contextlib.contextmanager
def seeded(seed: int):
    with _GLOBAL_GENERATOR:
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            yield
        finally:
            torch.random.set_rng_state(state)
