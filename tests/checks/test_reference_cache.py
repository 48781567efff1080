"""Cases that differ only in how the subject runs share one computed reference, and sharing changes
no number: the cached pair is bitwise the pair computed afresh."""
import numpy as np

from parity.checks import compare
from parity.matrix.cases import load
from parity.settings import RunSettings
from parity.subjects import SUBJECTS
from parity.subjects.base import Subject

ZERO0 = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
ZERO2 = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu"


def _case(case_id):
    return next(c for c in load() if c.id == case_id)


def _same(a, b):
    assert a.records.keys() == b.records.keys()
    for key in a.records:
        assert np.array_equal(a.records[key].numpy(), b.records[key].numpy()), key


def test_zero_stages_share_one_reference_and_it_is_the_fresh_one():
    references = compare.ReferenceCache()
    zero0, zero2 = _case(ZERO0), _case(ZERO2)
    subject = SUBJECTS[zero0.subject]
    assert subject.reference_key(zero0.values) == subject.reference_key(zero2.values)
    before = dict(references.stats())
    first = references.pair(subject, zero0.values)
    second = references.pair(subject, zero2.values)
    assert second is first
    assert references.stats()["misses"] == before["misses"] + 1
    assert references.stats()["hits"] == before["hits"] + 1
    fresh = subject.reference(zero2.values), subject.reference(zero2.values, compare.torch.float64)
    _same(first[0], fresh[0])
    _same(first[1], fresh[1])


def test_what_changes_the_reference_changes_the_key():
    base = _case(ZERO0)
    subject = SUBJECTS[base.subject]
    key = subject.reference_key(base.values)
    for axis, other in (("dtype", "bf16"), ("vocab", 34), ("hidden", 35), ("bias", False), ("reduction", "sum"),
                        ("gas", 1), ("dp", 2), ("clip", 1.0), ("ignore", "none")):
        assert subject.reference_key(base.values.replace(**{axis: other})) != key, axis


def test_a_subject_with_its_own_reference_is_never_shared():
    # Unless it says what that reference depends on (its own reference_key: the universal-checkpoint
    # subjects' AdamW trajectory, keyed apart from the SGD one).
    own = {c.subject for c in load() if type(SUBJECTS[c.subject]).reference is not Subject.reference
           and type(SUBJECTS[c.subject]).reference_key is Subject.reference_key}
    assert own  # ds_vocab_ce, liger_vocab_ce, inference_head, hf_plan_*, ...
    for case in load():
        if case.subject in own and not case.expect.is_error:
            assert SUBJECTS[case.subject].reference_key(case.values) is None, case.id


def test_the_baseline_switch_recomputes_every_reference():
    # what `parity run --no-reference-cache` sets
    references = compare.ReferenceCache.from_settings(RunSettings(reference_cache_size=0))
    zero0, zero2 = _case(ZERO0), _case(ZERO2)
    subject = SUBJECTS[zero0.subject]
    before = dict(references.stats())
    assert references.pair(subject, zero0.values) is not references.pair(subject, zero2.values)
    assert references.stats()["misses"] == before["misses"] + 2
