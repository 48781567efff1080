"""weight_changed (Comparison.check_weight_moved): where the reference moved a weight, the rank's weight
must move too, or hold an entry the reference moved at its new value already (a bf16 master crossed its
rounding midpoint a step early), or move that way on the next step to the reference's value there (a
step late). Found by parity explore: a one-entry bias shard's master crossed one step before the
reference's, both right. A weight that never moves, or skipped an update, still fails."""
from types import SimpleNamespace

from parity.checks.compare import Comparison, reference_pair
from parity.matrix.cases import load
from parity.subjects import SUBJECTS

CASE_ID = "direct_vocab_parallel-bf16-mean-v34-h32-bias-lm_head-ign_scattered-gas2-tp2-cpu"
NAME = "lm_head.bias"


class Weights(SimpleNamespace):
    def get(self, kind, step, micro, name):
        return (self.masters if kind == "master_weight" else self.by_step).get(step)


def judged(by_step: dict, step: int, masters: dict | None = None) -> list:
    case = next(c for c in load() if c.id == CASE_ID)
    subject = SUBJECTS[case.subject]
    reference, oracle = reference_pair(subject, case.values)
    cmp = Comparison(subject, case.values, {0: Weights(tp_rank=0, dp_rank=0, by_step={}, masters={})}, reference,
                     oracle)

    def ref(at):
        return cmp._param_view(NAME, reference.get("weight", at, None, None, NAME).numpy(), 0)
    weights = {s: (w if not isinstance(w, int) else ref(w)) for s, w in by_step.items()}
    cmp.obs[0].by_step = weights
    cmp.obs[0].masters = masters or {}
    cmp.check_weight_moved(NAME, weights[step], weights[step - 1], True, step, 0)
    return [c.passed for c in cmp.checks]


def test_a_weight_that_moves_as_the_reference_passes():
    assert judged({1: 1, 2: 2, 3: 3}, 2) == [True]


def test_a_weight_a_step_early_or_late_passes():
    assert judged({1: 2, 2: 2, 3: 3}, 2) == [True]  # already at the reference's step-2 weight
    assert judged({1: 1, 2: 1, 3: 3}, 2) == [True]  # catches up with the reference at step 3


def test_a_skipped_update_fails():
    assert judged({1: 1, 2: 1, 3: 2}, 2) == [False]  # one update behind from step 2 on


def test_a_frozen_weight_fails():
    # never moved: an entry may come back to its initial value on some step, not on every one
    frozen = {s: -1 for s in range(-1, 5)}
    assert False in [judged(frozen, step)[0] for step in range(5)]
    assert judged({1: 1, 2: 1, 3: 1}, 2) == [False]  # stopped after step 1


def test_a_weight_whose_master_moved_passes_and_a_skipped_master_fails():
    """bf16 with a float32 master the rank records: the master shows the update whatever the weight's last
    bits do (parity explore: column_gathered bf16 vocab 2, hidden 2, dp 2, proj.weight crossed its
    midpoint two steps after the reference). A master that did not move is a skipped update."""
    import numpy as np

    moved = {1: np.array([0.5]), 2: np.array([0.5 - 1e-5])}
    assert judged({1: 1, 2: 1, 3: 2}, 2, masters=moved) == [True]
    still = {1: np.array([0.5]), 2: np.array([0.5])}
    assert judged({1: 1, 2: 1, 3: 2}, 2, masters=still) == [False]
