"""The save axis (issue 13) on the DeepSpeed engine subjects, without a rank: which subjects have it, what it adds to
the DeepSpeed config, and which of its cases are the documented save_16bit_model divergence."""
from types import SimpleNamespace

from parity.explore.domains import HELD_AXES
from parity.axes import AXES
from parity.matrix.cases import load
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve

SAVING = ("column_gathered", "vocab_parallel", "row_parallel", "tied_row_parallel", "tied_vocab_parallel")


def _values(subject, **axes):
    return resolve(SUBJECTS[subject], axes)


def test_the_engine_heads_have_it_quiet_at_none():
    assert AXES["save"].default == "none" and AXES["save"].quiet_default
    for name in SAVING:
        assert "save" in SUBJECTS[name].axes, name
    assert HELD_AXES["save"][0] == "none"


def test_only_a_zero3_save_16bit_asks_deepspeed_to_gather_on_save():
    train = SimpleNamespace(batch=2, micro_batches=2, clip=0.0)
    subject = SUBJECTS["vocab_parallel"]
    for zero in (0, 1, 2, 3):
        for save in ("none", "16bit", "consolidated"):
            config = subject.ds_config(_values("vocab_parallel", zero=zero, save=save), train)["zero_optimization"]
            assert config.get("stage3_gather_16bit_weights_on_model_save", False) == (zero == 3 and save == "16bit")


def test_save_16bit_below_zero3_is_the_documented_divergence_and_nothing_else_is():
    cases = [c for c in load() if c.values.optional("save", "none") != "none"]
    assert {c.subject for c in cases} == set(SAVING)
    for case in cases:
        shard_file = case["save"] == "16bit" and case["zero"] < 3
        assert bool(case.divergence) == shard_file, case.id
        if shard_file:
            assert case.divergence.repro == "ci/repro/deepspeed_save_16bit_model_tp_shard.py"
            assert set(case.divergence.checks) == {"saved", "saved_weight"} and not case.divergence.raises
    # uneven shards over tp 2, 3 and 4, a grain, an empty shard, bf16: each at least once with the TP-aware gather
    consolidated = [c for c in cases if c["save"] == "consolidated"]
    assert {c["tp"] for c in consolidated} == {2, 3, 4}
    assert any(c.values.optional("grain", 1) > 1 for c in consolidated) and any(c["dtype"] == "bf16" for c in consolidated)
