"""Seeded model construction is atomic across threads (`parity run -j N` builds references in threads)."""
import contextlib
import sys
import threading

import pytest
import torch

from references import seeding
from references.tiny_lm import ModelSpec, build_model

SPECS = [ModelSpec(vocab=34, hidden=32), ModelSpec(vocab=35, hidden=35, bias=False)]


def _build_concurrently(rounds: int = 12) -> list:
    results, errors = [], []

    def work(i):
        try:
            for _ in range(rounds):
                spec = SPECS[i % 2]
                results.append((i % 2, build_model(spec, 1234 + i % 2, torch.float32).state_dict()))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors
    return results


def _mismatches(results) -> int:
    serial = [build_model(spec, 1234 + k, torch.float32).state_dict() for k, spec in enumerate(SPECS)]
    return sum(any(not torch.equal(state[n], serial[k][n]) for n in state) for k, state in results)


def test_threads_get_the_serial_weights():
    assert _mismatches(_build_concurrently()) == 0


def test_without_the_lock_threads_interleave_their_draws(monkeypatch):
    # The check above can fail: with the lock replaced by nothing, concurrent builds get other weights.
    monkeypatch.setattr(seeding, "_GLOBAL_GENERATOR", contextlib.nullcontext())
    for _ in range(5):
        if _mismatches(_build_concurrently()):
            return
    pytest.fail("unlocked concurrent construction never interleaved: this test cannot show the race")
