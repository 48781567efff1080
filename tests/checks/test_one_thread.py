"""A reference is a function of the case, not of the parent's torch thread count (parity/checks/one_thread.py)."""
import hashlib

import torch

from parity.checks.compare import reference_pair
from parity.checks.one_thread import one_torch_thread
from parity.matrix.cases import load
from parity.subjects import SUBJECTS

# Its float32 reference differs in the last bits between one and two torch threads when computed plainly.
CASE_ID = "torch_column_gathered-fp32-mean-v9-h32-bias-lm_head-ign_scattered-gas2-tp4-cpu"


def _digest(pair) -> str:
    h = hashlib.sha256()
    for trajectory in pair:
        for key in sorted(trajectory.records, key=repr):
            h.update(repr(key).encode() + trajectory.records[key].numpy().tobytes())
    return h.hexdigest()


def test_the_reference_is_the_same_on_one_thread_or_two():
    case = next(c for c in load() if c.id == CASE_ID)
    subject, before = SUBJECTS[case.subject], torch.get_num_threads()
    try:
        digests = []
        for threads in (2, 1):
            torch.set_num_threads(threads)
            digests.append(_digest(reference_pair(subject, case.values)))  # computed afresh, never cached
            assert torch.get_num_threads() == threads  # restored
        assert digests[0] == digests[1]
    finally:
        torch.set_num_threads(before)


def test_the_setting_is_put_back():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with one_torch_thread():
            assert torch.get_num_threads() == 1
            with one_torch_thread():
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
