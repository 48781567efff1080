"""The DeepSpeed loss subjects' references, claims and checks, without rank processes.

The references are checked against torch's own cross entropy and autograd (float64); the claims
through the suite's partition formula; and the comparison is fed observations built from the
reference itself, once faithful (passes) and once with a planted error (fails).
"""
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity.axes import AXES
from parity.matrix.cases import case_id, load_file, subject_axes
from parity.checks.compare import compare, reference_pair
from parity.observe.observations import RankObservations
from parity.observe.partition import shard_sizes, shard_slice
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve
from references.cross_entropy import (SCALAR_UPSTREAM, ce_inputs, ce_reference, linear_ce_inputs,
                                      linear_ce_reference, reduce_losses)
from references.loss import token_losses

CASE_FILE = Path(__file__).resolve().parents[2] / "cases" / "deepspeed_ce.toml"
F64 = torch.float64


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore", ["none", "scattered"])
def test_reduced_ce_matches_torch_cross_entropy(reduction, ignore):
    logits, targets, _ = ce_inputs(7, 24, 35, ignore, F64)
    want = F.cross_entropy(logits, targets, ignore_index=-100, reduction=reduction)
    got = reduce_losses(token_losses(logits, targets, -100), targets, reduction, -100)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_mean_over_an_all_ignored_batch_is_nan_as_in_torch():
    # torch's F.cross_entropy gives 0/0 = nan here; DeepSpeed's 0 is a documented divergence.
    targets = torch.full((4,), -100)
    got = reduce_losses(torch.zeros(4, dtype=F64), targets, "mean", -100)
    want = F.cross_entropy(torch.randn(4, 5, dtype=F64), targets, reduction="mean")
    assert torch.isnan(got) and torch.isnan(want)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_ce_reference_gradient_is_autograd_of_torch_ce(reduction):
    logits, targets, upstream = ce_inputs(4321, 24, 35, "scattered", torch.float32)
    x = logits.to(F64).requires_grad_(True)
    loss = F.cross_entropy(x, targets, ignore_index=-100, reduction=reduction)
    (loss * upstream.to(F64) if reduction == "none" else loss * SCALAR_UPSTREAM).sum().backward()
    traj = ce_reference(4321, 24, 35, "scattered", torch.float32, F64, reduction=reduction)
    torch.testing.assert_close(traj.get("loss", 0, 0, 0, None), loss.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(traj.get("logits_grad", 0, 0, 0, None), x.grad, rtol=1e-12, atol=1e-12)
    assert traj.get("loss", 0, 0, 0, None).shape == ((24,) if reduction == "none" else ())


def test_default_reduction_keeps_the_liger_reference_unchanged():
    a = ce_reference(4321, 24, 32, "scattered", torch.bfloat16)
    b = ce_reference(4321, 24, 32, "scattered", torch.bfloat16, reduction="none")
    for key in a.records:
        assert torch.equal(a.records[key], b.records[key])


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_ce_reference_gradients_are_autograd_of_linear_plus_torch_ce(reduction, bias):
    h, w, b, targets, upstream = linear_ce_inputs(4321, 24, 35, 16, bias, "scattered", torch.float32)
    x, wt = h.to(F64).requires_grad_(True), w.to(F64).requires_grad_(True)
    bt = None if b is None else b.to(F64).requires_grad_(True)
    loss = F.cross_entropy(F.linear(x, wt, bt), targets, ignore_index=-100, reduction=reduction)
    (loss * upstream.to(F64) if reduction == "none" else loss * SCALAR_UPSTREAM).sum().backward()
    traj = linear_ce_reference(4321, 24, 35, 16, bias, "scattered", torch.float32, F64, reduction=reduction)
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(traj.get("loss", 0, 0, 0, None), loss.detach(), **close)
    torch.testing.assert_close(traj.get("hidden_grad", 0, 0, 0, None), x.grad, **close)
    torch.testing.assert_close(traj.get("weight_grad", 0, 0, 0, None), wt.grad, **close)
    assert (("bias_grad", 0, 0, 0, None) in traj.records) == bias
    if bias:
        torch.testing.assert_close(traj.get("bias_grad", 0, 0, 0, None), bt.grad, **close)


def test_linear_ce_inputs_are_exact_in_the_case_dtype():
    h32, w32, b32, t32, _ = linear_ce_inputs(1, 24, 35, 16, True, "scattered", torch.float32)
    h, w, b, t, _ = linear_ce_inputs(1, 24, 35, 16, True, "scattered", torch.bfloat16)
    assert torch.equal(h, h32.to(torch.bfloat16)) and torch.equal(w, w32.to(torch.bfloat16))
    assert torch.equal(t, t32) and (t == -100).any() and (t != -100).any()


def test_claims_name_sharded_records():
    ce = SUBJECTS["ds_vocab_ce"].claims(resolve(SUBJECTS["ds_vocab_ce"], {}))
    assert ce.micro_records == {"loss": None, "logits_grad": -1, "logits_after": -1}
    assert ce.exact_records == ("logits_after",)
    fused = SUBJECTS["ds_fused_linear_ce"]

    def claims(**values):
        return fused.claims(resolve(fused, values))

    assert claims(bias=True).micro_records == {"loss": None, "hidden_grad": None, "weight_grad": 0,
                                                          "bias_grad": 0}
    assert "bias_grad" not in claims(bias=False).micro_records
    # Its low-precision records are one computation from the reference's exact inputs (compare.close).
    assert claims(bias=True, dtype="bf16").stage_local
    assert not claims(bias=True, dtype="fp32").stage_local


def test_case_file_covers_uneven_vocab_reductions_and_chunks():
    cases = load_file(CASE_FILE)
    assert 100 <= len(cases) <= 400  # 261 since the vocab-parallel ops' 59 cases; 282 with ds_vocab_kl / ds_vocab_ce_module; 294 with the 12 global_vocab ones; 333 with the 39 TP x SP ones
    for name in ("ds_vocab_ce", "ds_fused_linear_ce"):
        mine = [c for c in cases if c.subject == name]
        assert {c["reduction"] for c in mine} == {"none", "sum", "mean"}
        assert {c["tp"] for c in mine} == {2, 3}
        assert any(len(set(shard_sizes(c["vocab"], c["tp"]))) > 1 for c in mine)  # uneven
        assert any(len(set(shard_sizes(c["vocab"], c["tp"]))) == 1 for c in mine)  # even
    assert {c["chunk"] for c in cases if c.subject == "ds_fused_linear_ce"} == {0, 5}
    for name in ("ds_vocab_ce", "ds_vocab_seq_ce", "ds_fused_linear_ce"):  # TP x SP, the SP-global reductions
        sequence_parallel = [c for c in cases if c.subject == name and c["sp"] > 1]
        assert {c["reduction"] for c in sequence_parallel} >= {"none", "mean"}
        assert {c["dtype"] for c in sequence_parallel} == {"fp32", "bf16"}
    assert {c["seq_gather"] for c in cases if c.subject in ("ds_vocab_ce", "ds_vocab_seq_ce")} == {False, True}


def test_chunk_axis_leaves_other_subjects_ids_alone():
    values = {"backend": "torch", "dtype": "fp32", "reduction": "mean", "vocab": 34, "hidden": 32, "bias": True,
              "head": "lm_head", "ignore": "scattered", "zero": 0, "gas": 2, "tp": 2, "dp": 1, "device": "cpu",
              "head_input": "sequence", "chunk": 5, "grain": 1, "clip": 0.0}
    values = {**{a: AXES[a].default for a in subject_axes(SUBJECTS["vocab_parallel"])}, **values}  # axes added later
    assert "chunk" not in case_id("vocab_parallel", values)
    for path in CASE_FILE.parent.glob("*.toml"):
        if path != CASE_FILE:
            assert not any("chunk" in c.id for c in load_file(path))


# -- the comparison, fed observations made from the reference (no ranks) ------------------------

def _observations(subject, values, plant=None, reference=None):
    """What a faithful subject would report: each rank's slice of the case-dtype reference (or of
    ``reference``, a trajectory standing in for it)."""
    reference = reference or subject.reference(values)
    claims = subject.claims(values)
    tp = values["tp"]
    obs = {}
    for rank in range(tp * values.optional("sp", 1)):
        o = RankObservations(rank, rank % tp, rank // tp)  # the SP rank in the DP slot, as the ranks report it
        o.facts["state_at_start"] = subject.clean_state
        for kind, dim in claims.micro_records.items():
            full = reference.get(kind, 0, 0, o.dp_rank, None).numpy().copy()
            if plant:
                full = plant(kind, full)
            if dim is not None:
                index = [slice(None)] * full.ndim
                index[dim] = shard_slice(full.shape[dim], tp, o.tp_rank)
                full = full[tuple(index)]
            o.tensors[(kind, 0, 0, None)] = full
            o.dtypes[(kind, 0, 0, None)] = reference.layouts[(kind, 0, 0, o.dp_rank, None)][0]  # a faithful dtype too
        obs[rank] = o
    return obs


def _failed(subject, values, obs):
    return [c.name for c in compare(subject, values, obs, *reference_pair(subject, values)) if not c.passed]


FUSED = resolve(SUBJECTS["ds_fused_linear_ce"], {"dtype": "bf16", "reduction": "mean", "vocab": 35, "bias": True,
                                                 "chunk": 5, "ignore": "scattered", "tp": 3, "device": "cpu"})
VOCAB = resolve(SUBJECTS["ds_vocab_ce"], {"dtype": "fp16", "reduction": "sum", "vocab": 269, "ignore": "scattered",
                                          "tp": 3, "device": "cpu"})


SEQUENCE = resolve(SUBJECTS["ds_vocab_ce"], {"dtype": "fp32", "reduction": "mean", "vocab": 32, "ignore": "scattered",
                                             "tp": 2, "sp": 2, "device": "cpu"})
FUSED_SEQUENCE = FUSED.replace(tp=2, sp=2, chunk=0)


@pytest.mark.parametrize("name,values", [("ds_fused_linear_ce", FUSED), ("ds_vocab_ce", VOCAB),
                                         ("ds_vocab_ce", SEQUENCE), ("ds_vocab_ce", SEQUENCE.replace(reduction="none")),
                                         ("ds_vocab_ce", SEQUENCE.replace(reduction="none", seq_gather=True)),
                                         ("ds_fused_linear_ce", FUSED_SEQUENCE)])
def test_faithful_observations_pass(name, values):
    subject = SUBJECTS[name]
    assert _failed(subject, values, _observations(subject, values)) == []


@pytest.mark.parametrize("name,values,kind", [("ds_fused_linear_ce", FUSED, "weight_grad"),
                                              ("ds_fused_linear_ce", FUSED, "hidden_grad"),
                                              ("ds_vocab_ce", VOCAB, "logits_grad")])
def test_an_ignored_scalar_upstream_is_caught(name, values, kind):
    subject = SUBJECTS[name]
    obs = _observations(subject, values, lambda k, a: a / SCALAR_UPSTREAM if k == kind else a)
    assert kind in _failed(subject, values, obs)


def test_mean_over_all_tokens_instead_of_valid_ones_is_caught():
    subject = SUBJECTS["ds_fused_linear_ce"]
    _, _, _, targets, _ = linear_ce_inputs(4321, 24, 35, 16, True, "scattered", torch.bfloat16)
    ratio = float((targets != -100).sum()) / targets.numel()
    obs = _observations(subject, FUSED, lambda k, a: a * ratio if k == "loss" else a)
    assert "loss" in _failed(subject, FUSED, obs)


def test_remainder_on_the_last_rank_is_caught():
    """269 over 3 is 90, 90, 89 by the suite's formula; a layout giving the remainder to the last
    rank (89, 89, 91) holds the right numbers in the wrong places."""
    subject = SUBJECTS["ds_vocab_ce"]
    obs = _observations(subject, VOCAB)
    full = np.concatenate([obs[r].tensors[("logits_grad", 0, 0, None)] for r in range(3)], axis=-1)
    bounds = [0, 89, 178, 269]
    for r in range(3):
        obs[r].tensors[("logits_grad", 0, 0, None)] = full[:, bounds[r]:bounds[r + 1]]
    failed = _failed(subject, VOCAB, obs)
    assert "shard_width[logits_grad]" in failed and "logits_grad" in failed


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_bf16_fused_ce_scalar_loss_catches_a_one_percent_scale(reduction):
    # The fused CE's loss is float32 from bf16 logits, each rounded once: its floor is float32's, and
    # the bf16 part is the reference's own error. Under a bf16 floor (16 units of the loss) a 6% scale passed.
    subject, values = SUBJECTS["ds_fused_linear_ce"], FUSED.replace(reduction=reduction)
    assert _failed(subject, values, _observations(subject, values)) == []
    obs = _observations(subject, values, lambda k, a: a * 1.01 if k == "loss" else a)
    assert "loss" in _failed(subject, values, obs)


# global_vocab_size (the global_vocab axis) and Liger's label-smoothing options (ls_formula, ls_mode).

def test_global_vocab_axis_names_the_size_passed():
    from parity.subjects.deepspeed_ce import global_vocab_size

    def size(**values):
        return global_vocab_size(resolve(SUBJECTS["ds_vocab_ce"], values))

    assert [size(vocab=35, global_vocab=g) for g in ("unset", "exact", "under", "over")] == [None, 35, 34, 36]
    assert size(vocab=35) is None  # the axis's default: not passed, DeepSpeed validates


def test_ds_liger_ce_backend_claim_follows_the_true_layout_on_the_gated_path():
    """Through DeepSpeed's gate (cuda, or triton claimed on CPU) the backend that must run is decided from the
    real shards, never from the global_vocab_size the case passes: Liger on equal shards, torch on uneven ones."""
    subject = SUBJECTS["ds_liger_ce"]
    base = resolve(subject, {"dtype": "fp32", "ignore": "scattered", "tp": 2, "device": "cpu", "backward": "once"})
    for vocab, gvs, want in [(32, "exact", "liger"), (32, "over", "liger"), (35, "over", "torch"),
                             (35, "exact", "torch")]:
        values = base.replace(vocab=vocab, global_vocab=gvs, triton="claimed")
        assert subject.claims(values).loss_backend == want
        assert not subject.needs_equal_shards(values)  # an uneven layout runs (DeepSpeed routes it), no skip
    direct = base.replace(vocab=35, global_vocab="unset", triton="device")
    assert subject.claims(direct).loss_backend is None and subject.needs_equal_shards(direct)
    assert "equal vocabulary shards" in subject.unavailable_reason(direct)


def test_ds_liger_ce_direct_path_refuses_a_global_vocab_it_would_ignore():
    subject = SUBJECTS["ds_liger_ce"]
    values = resolve(subject, {"dtype": "fp32", "vocab": 32, "ignore": "scattered", "tp": 2, "device": "cpu",
                               "backward": "once", "global_vocab": "over", "triton": "device"})
    with pytest.raises(ValueError, match="global_vocab needs the gated path"):
        subject.loss(values, None, None, None, None, None, RankObservations(0, 0, 0))


def test_liger_smoothing_options_reach_liger_and_leave_the_reference_torchs(monkeypatch):
    """The formula and mode are handed to LigerVocabParallelCEFunction as the case names them, and the reference
    is torch's label_smoothing whatever they are (their differences are documented divergences)."""
    from liger_kernel.ops import vocab_parallel_cross_entropy as liger

    seen = []

    class Recorder:
        @staticmethod
        def apply(logits, targets, group, ignore_index, smoothing, formula, mode):
            seen.append((smoothing, formula, mode))
            return torch.zeros(logits.shape[:2])

    monkeypatch.setattr(liger, "LigerVocabParallelCEFunction", Recorder)
    subject = SUBJECTS["liger_vocab_ce"]
    values = resolve(subject, {"dtype": "fp32", "vocab": 32, "ignore": "scattered", "tp": 2, "device": "cpu",
                               "backward": "once", "targets": "valid", "label_smoothing": 0.1})
    local, targets = torch.zeros(24, 16), torch.zeros(24, dtype=torch.long)
    for formula, mode in [("pytorch", "global"), ("megatron", "global"), ("pytorch", "partition")]:
        subject.loss(values.replace(ls_formula=formula, ls_mode=mode), None, local, targets, None, None, None)
    assert seen == [(0.1, "pytorch", "global"), (0.1, "megatron", "global"), (0.1, "pytorch", "partition")]
    torch_ref = subject.reference(values.replace(ls_formula="pytorch", ls_mode="global"))
    for formula, mode in [("megatron", "global"), ("megatron", "partition")]:
        ref = subject.reference(values.replace(ls_formula=formula, ls_mode=mode))
        assert all(torch.equal(ref.records[k], torch_ref.records[k]) for k in torch_ref.records)


def test_new_case_entries_carry_their_axes():
    ids = {case_id(c.subject, c.values) for c in load_file(CASE_FILE)}
    assert {"ds_vocab_ce-fp32-none-v32-ign_scattered-tp2-cpu-gvs_over-tgt_oob",
            "ds_liger_ce-fp32-v35-ign_scattered-tp2-cpu-gvs_over-triton_claimed"} <= ids
    liger_ids = {case_id(c.subject, c.values) for c in load_file(CASE_FILE.parent / "liger_ce.toml")}
    assert "liger_vocab_ce-fp32-v32-ign_scattered-tp2-cpu-ls0.1-lsf_megatron-lsm_partition" in liger_ids


def test_a_mean_of_the_sequence_chunks_means_is_caught():
    """The mistake SP makes easy: each chunk's own mean, averaged over the chunks (7 and 10 of the 12 targets
    of vocab 32's chunks count), instead of the mean over the sequence's tokens."""
    subject = SUBJECTS["ds_vocab_ce"]
    logits, targets, _ = ce_inputs(4321, 24, 32, "scattered", torch.float32)
    per_token = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    chunk_means = [per_token[rows].sum() / (targets[rows] != -100).sum() for rows in (slice(0, 12), slice(12, 24))]
    mean_of_means = float(sum(chunk_means) / 2)
    obs = _observations(subject, SEQUENCE, lambda k, a: np.asarray(mean_of_means) if k == "loss" else a)
    assert "loss" in _failed(subject, SEQUENCE, obs)


def test_sequence_chunks_on_the_wrong_sp_ranks_are_caught():
    subject, values = SUBJECTS["ds_vocab_ce"], SEQUENCE.replace(reduction="none")
    obs = _observations(subject, values)
    for tp_rank in range(2):  # ranks tp_rank (SP 0) and tp_rank + 2 (SP 1) swap their rows
        first, second = obs[tp_rank].tensors, obs[tp_rank + 2].tensors
        key = ("logits_grad", 0, 0, None)
        first[key], second[key] = second[key], first[key]
    assert "logits_grad" in _failed(subject, values, obs)


@pytest.mark.parametrize("ignore_index", [0, 3])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_ce_reference_with_another_ignore_index_is_torchs(ignore_index, reduction):
    # The ds_vocab_ce ignidx cases: torch's F.cross_entropy(ignore_index=k), drawn targets equal to k ignored too.
    logits, targets, upstream = ce_inputs(4321, 24, 35, "scattered", torch.float32, ignore_index)
    assert (targets == ignore_index).sum() > 1 and not (targets == -100).any()
    x = logits.to(F64).requires_grad_(True)
    loss = F.cross_entropy(x, targets, ignore_index=ignore_index, reduction=reduction)
    (loss * upstream.to(F64) if reduction == "none" else loss * SCALAR_UPSTREAM).sum().backward()
    traj = ce_reference(4321, 24, 35, "scattered", torch.float32, F64, ignore_index, reduction=reduction)
    torch.testing.assert_close(traj.get("loss", 0, 0, 0, None), loss.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(traj.get("logits_grad", 0, 0, 0, None), x.grad, rtol=1e-12, atol=1e-12)


def test_a_stray_minus100_target_needs_another_ignore_index():
    subject = SUBJECTS["ds_vocab_ce"]
    base = resolve(subject, {"dtype": "fp32", "reduction": "none", "vocab": 35, "ignore": "scattered", "tp": 2,
                             "targets": "minus100"})
    assert subject.invalid(base)
    assert subject.invalid(base.replace(ignore_index=3)) is None


def test_uneven_sequence_chunks_cover_the_sequence():
    from references.cross_entropy import sequence_chunk, sequence_chunk_sizes

    assert sequence_chunk_sizes(24, 2, uneven=True) == [15, 9]
    assert sequence_chunk_sizes(24, 3, uneven=True) == [10, 8, 6]
    assert sequence_chunk_sizes(24, 2) == [12, 12]
    rows = [sequence_chunk(24, 3, i, uneven=True) for i in range(3)]
    assert [(r.start, r.stop) for r in rows] == [(0, 10), (10, 18), (18, 24)]


@pytest.mark.parametrize("weighted", [False, True])
def test_a_mean_of_uneven_chunks_means_is_caught(weighted):
    """Over 15 and 9 tokens a chunk-size-weighted mean of the chunks' means is a mistake too: the sequence's mean
    weighs the chunks by their counted targets, not their tokens."""
    from references.cross_entropy import sequence_chunk

    values = SEQUENCE.replace(vocab=35, sp_chunks="uneven")
    subject = SUBJECTS["ds_vocab_ce"]
    assert subject.invalid(values) is None
    logits, targets, _ = ce_inputs(4321, 24, 35, "scattered", torch.float32)
    per_token = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    chunks = [sequence_chunk(24, 2, i, uneven=True) for i in range(2)]
    means = [per_token[rows].sum() / (targets[rows] != -100).sum() for rows in chunks]
    sizes = [rows.stop - rows.start for rows in chunks]
    wrong = float(sum(m * s for m, s in zip(means, sizes)) / 24 if weighted else sum(means) / 2)
    assert "loss" in _failed(subject, values, _observations(subject, values, lambda k, a: np.asarray(wrong)
                                                            if k == "loss" else a))
    assert _failed(subject, values, _observations(subject, values)) == []
    assert subject.invalid(values.replace(seq_gather=True, reduction="none"))
