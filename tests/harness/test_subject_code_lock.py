"""The parent runs a subject's code (references, the comparison's claims and rounding reruns) in one thread at a
time: transformers' from_pretrained swaps process globals for its duration, and two loads interleaved in the
reference and judge threads left PreTrainedModel.tie_weights a no-op and zoo_transformers_tp's verdicts depending
on case order (findings/transformers_from_pretrained_threads_leave_globals.toml)."""
from __future__ import annotations

import textwrap
import threading
import time
from concurrent.futures import Future

from parity.checks.compare import Check
from parity.checks.verdict import PASSED
from parity.harness import runner
from parity.harness.rank_pool import PoolOutcome
from parity.matrix.cases import load_file


def test_references_never_overlap(monkeypatch):
    running, most = [0], [0]
    guard = threading.Lock()

    def reference_pair(subject, values):
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with guard:
            running[0] -= 1
        return None, None

    monkeypatch.setattr(runner, "reference_pair", reference_pair)
    threads = [threading.Thread(target=runner.timed_reference_pair, args=(None, {})) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_the_comparison_holds_the_same_lock(monkeypatch, tmp_path):
    held = []

    def compare(*args, **kwargs):
        held.append(runner.SUBJECT_CODE._is_owned())
        return [Check("numbers", True, measured=0.0, bound=1.0)]

    monkeypatch.setattr(runner, "compare", compare)
    path = tmp_path / "m.toml"
    path.write_text(textwrap.dedent("""
        [[matrix]]
        subject = "torch_vocab_parallel"
        [matrix.axes]
        vocab = [9]
        tp = [2]
        """))
    reference: Future = Future()
    reference.set_result(((None, None), 0.0))
    verdict = runner.judge(load_file(path)[0], PoolOutcome(), strict=False, reference=reference)
    assert verdict.status == PASSED and held == [True]
