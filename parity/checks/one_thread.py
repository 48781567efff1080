"""References, rounding samples and comparisons run on one torch thread, whatever the machine.

torch's CPU kernels split some reductions by thread count, so a float32 reference computed on two
threads can differ in its last bits from one computed on one (measured: the fp32 reference of
torch_column_gathered-fp32-mean-v9-h32-bias-lm_head-ign_scattered-gas2-tp4-cpu, whose 28 bounds moved in
the 4th digit when the parent went from two threads to one). A verdict must be a function of the case,
not of the core count of the machine or of whether the harness pipelines: the ranks already run on one
thread (parity/harness/rank_worker.py), and so does everything the parent computes for a case.

With torch's OpenMP backend the setting belongs to the calling thread (a thread started later takes the
starting thread's), so each user sets its own and puts back what it found.
"""
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
