"""The record schema (parity/observe/records.py) against what the subjects record and the references hold."""
import re
from pathlib import Path

import pytest
import torch

from parity.matrix.cases import load
from parity.observe.observations import RankObservations
from parity.observe.records import BLOCK, RECORDS, STAGE, STAGES, record_kind
from parity.subjects import SUBJECTS

ROOT = Path(__file__).resolve().parents[2]


def test_an_unknown_kind_is_refused_at_record():
    with pytest.raises(ValueError, match="record kind 'logits_softmax' has no entry in the record schema"):
        RankObservations(0, 0, 0).record("logits_softmax", 0, 0, None, torch.zeros(3))


def test_every_kind_a_subject_records_is_declared():
    recorded = {m for p in (ROOT / "parity").rglob("*.py") for m in re.findall(r'\.record\("(\w+)"', p.read_text())}
    assert recorded and recorded <= set(RECORDS)


def test_stage_entries_are_stage_local_and_end_to_end_ones_are_not():
    assert {k.mode for k in STAGES.values()} == {STAGE} and STAGE not in {k.mode for k in RECORDS.values()}
    with pytest.raises(ValueError, match="no stage-local check"):
        record_kind("weight", stage=True)


def test_floor_rules():
    """The floors the checks used before the schema: the reference's path dtype where it gives one, else the
    case dtype; weights and the norm the case dtype whatever the path; the CE stage float32; the other stages
    the stages' compute dtype."""
    path = {"loss": torch.float32, "grad": torch.bfloat16, "weight": torch.bfloat16}
    assert record_kind("loss").floor_dtype("fp32", "bf16", path) is torch.float32
    assert record_kind("grad").floor_dtype("fp32", "bf16", path) is torch.bfloat16
    assert record_kind("logits").floor_dtype("fp32", "bf16", path) == "fp32"
    assert record_kind("weight").floor_dtype("fp32", "bf16", path) == "fp32"
    assert record_kind("grad_norm").floor_dtype("fp32", "bf16", path) == "fp32"
    assert record_kind("loss", stage=True).floor_dtype("bf16", "bf16", {}) is torch.float32
    for kind in ("logits", "head_input_grad", "grad"):
        assert record_kind(kind, stage=True).floor_dtype("fp32", "bf16", path) == "bf16"


def _cases():
    return [c for c in load() if not c.expect.is_error and c.values.optional("device", "cpu") == "cpu"]


def test_only_block_kinds_are_sharded():
    for case in _cases():
        claims = SUBJECTS[case.subject].claims(case.values)
        sharded = {k for k, dim in claims.micro_records.items() if dim is not None}
        assert all(record_kind(k).mode == BLOCK for k in sharded), (case.id, sharded)


def test_dtype_contract_is_the_references():
    """One case per subject, dtype, autocast and master setting: every record the reference holds is a schema
    kind, held in the dtype the schema's contract names."""
    torch.set_num_threads(1)
    first = {}
    for case in _cases():
        v = case.values
        first.setdefault((case.subject, v.optional("dtype", None), v.optional("autocast", "off"),
                          v.optional("bf16_master", None)), case)
    for (subject, dtype, autocast, bf16_master), case in sorted(first.items(), key=repr):
        reference = SUBJECTS[subject].reference(case.values)
        master = SUBJECTS[subject].training_spec(case.values).master
        for (kind, *_), (held, _) in reference.layouts.items():
            want = record_kind(kind).reference_dtype(dtype, autocast, master)
            assert held == str(want).replace("torch.", ""), (case.id, kind)
