"""References, rounding samples and comparisons run on one torch thread, whatever the machine, as the ranks do:
a verdict must not depend on the core count (docs/tolerances.md#one-torch-thread). The setting is the calling
thread's, so each user sets its own and puts back what it found."""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def one_torch_thread():
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)
