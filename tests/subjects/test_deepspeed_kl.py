"""ds_vocab_kl's reference and layouts, and ds_vocab_ce_module's claims, without rank processes.

The KL reference is checked against what a user writes in plain torch (F.kl_div with log_target=True,
summed per token) and its autograd in float64; the comparison is fed observations made from the
reference, once faithful (passes) and once with a planted error (fails).
"""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from parity.checks.compare import compare, reference_pair
from parity.matrix.cases import load_file
from parity.observe.partition import shard_sizes, shard_slice
from parity.subjects import SUBJECTS
from parity.subjects.deepspeed_kl import teacher_columns
from parity.subjects.values import resolve
from references.cross_entropy import ce_inputs, ce_reference
from references.kl_div import kl_inputs, kl_reference, token_kl
from references.loss import token_losses
from tests.subjects.test_deepspeed_ce import _observations

CASE_FILE = Path(__file__).resolve().parents[2] / "cases" / "deepspeed_ce.toml"
F64 = torch.float64
SEED, TOKENS = 4321, 24


def _torch_kl(student, teacher, reverse):
    """The plain-torch expression the reference stands for: F.kl_div(input=log q, target=log p) = KL(p || q)."""
    log_s, log_t = F.log_softmax(student, dim=-1), F.log_softmax(teacher, dim=-1)
    if reverse:
        return F.kl_div(log_t, log_s, log_target=True, reduction="none").sum(-1)
    return F.kl_div(log_s, log_t, log_target=True, reduction="none").sum(-1)


@pytest.mark.parametrize("reverse", [False, True])
def test_token_kl_is_torch_kl_div_summed_per_token(reverse):
    s, t, _ = kl_inputs(7, TOKENS, 35, F64)
    got = token_kl(s, t, reverse)
    torch.testing.assert_close(got, _torch_kl(s, t, reverse), rtol=1e-12, atol=1e-12)
    assert got.shape == (TOKENS,) and (got > 0).all()
    # Its mean over tokens is F.kl_div's "batchmean", not its default "mean" (which also divides by the vocabulary).
    log_s, log_t = F.log_softmax(s, -1), F.log_softmax(t, -1)
    a, b = (log_t, log_s) if reverse else (log_s, log_t)
    torch.testing.assert_close(got.mean(), F.kl_div(a, b, log_target=True, reduction="batchmean"),
                               rtol=1e-12, atol=1e-12)
    with pytest.warns(UserWarning, match="batchmean"):  # torch itself warns that "mean" is not the KL's mean
        assert not torch.isclose(got.mean(), F.kl_div(a, b, log_target=True, reduction="mean"))


def test_forward_and_reverse_differ():
    s, t, _ = kl_inputs(7, TOKENS, 35, F64)
    assert (token_kl(s, t, False) - token_kl(s, t, True)).abs().max() > 0.1


def test_token_kl_upcasts_bf16_to_float32():
    s, t, _ = kl_inputs(7, TOKENS, 35, torch.bfloat16)
    got = token_kl(s, t, False)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _torch_kl(s.float(), t.float(), False))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("grad", ["student", "teacher", "both"])
def test_kl_reference_gradients_are_autograd_of_torch_kl_div(reverse, grad):
    s32, t32, upstream = kl_inputs(SEED, TOKENS, 35, torch.float32)
    s = s32.to(F64).requires_grad_(grad != "teacher")
    t = t32.to(F64).requires_grad_(grad != "student")
    loss = _torch_kl(s, t, reverse)
    (loss * upstream.to(F64)).sum().backward()
    traj = kl_reference(SEED, TOKENS, 35, reverse, grad, torch.float32, F64)
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(traj.get("loss", 0, 0, 0, None), loss.detach(), **close)
    assert (("student_grad", 0, 0, 0, None) in traj.records) == (grad != "teacher")
    assert (("teacher_grad", 0, 0, 0, None) in traj.records) == (grad != "student")
    if grad != "teacher":
        torch.testing.assert_close(traj.get("student_grad", 0, 0, 0, None), s.grad, **close)
    if grad != "student":
        torch.testing.assert_close(traj.get("teacher_grad", 0, 0, 0, None), t.grad, **close)
    assert torch.equal(traj.get("student_after", 0, 0, 0, None), s32.to(F64))


def test_kl_inputs_are_exact_in_the_case_dtype():
    s32, t32, u32 = kl_inputs(1, TOKENS, 35, torch.float32)
    s, t, u = kl_inputs(1, TOKENS, 35, torch.bfloat16)
    assert torch.equal(s, s32.to(torch.bfloat16)) and torch.equal(t, t32.to(torch.bfloat16)) and torch.equal(u, u32)


@pytest.mark.parametrize("vocab,tp", [(32, 2), (32, 3), (35, 3), (2, 2)])
def test_teacher_layouts(vocab, tp):
    same = [teacher_columns(vocab, tp, r, "same") for r in range(tp)]
    shifted = [teacher_columns(vocab, tp, r, "shifted") for r in range(tp)]
    for r in range(tp):
        part = shard_slice(vocab, tp, r)
        assert same[r].tolist() == list(range(part.start, part.stop))
        assert len(shifted[r]) == len(same[r]) and shifted[r].tolist() != same[r].tolist()
    # Shifted: every id still held once, by a rank of the same width: only the alignment is wrong.
    assert sorted(torch.cat(shifted).tolist()) == list(range(vocab))
    reversed_ = [teacher_columns(vocab, tp, r, "reversed") for r in range(tp)]
    assert [len(c) for c in reversed_] == shard_sizes(vocab, tp)[::-1]


def test_ce_module_reference_takes_the_ignore_index_axis():
    subject = SUBJECTS["ds_vocab_ce_module"]
    values = resolve(subject, {"dtype": "fp32", "reduction": "sum", "vocab": 35, "ignore": "scattered", "ignore_index": 0,
                               "backend": "torch", "triton": "device", "tp": 3, "device": "cpu"})
    got = subject.reference(values).get("loss", 0, 0, 0, None)
    zero = ce_reference(SEED, TOKENS, 35, "scattered", torch.float32, None, 0, reduction="sum").get("loss", 0, 0, 0, None)
    assert torch.equal(got, zero)
    # Its ignored targets are 0: a module that dropped ignore_index (-100) would count them as token 0.
    logits, targets, _ = ce_inputs(SEED, TOKENS, 35, "scattered", torch.float32, 0)
    assert (targets == 0).sum() >= 2
    assert abs(float(token_losses(logits, targets, -100).sum()) - float(got)) > 1.0
    assert subject.claims(values).loss_backend == "torch"
    assert subject.claims(values.replace(vocab=32, tp=2, backend="liger", triton="claimed")).loss_backend \
        == "liger"
    # Every other loss-only subject keeps -100.
    assert SUBJECTS["ds_vocab_ce"].ignore_index(resolve(SUBJECTS["ds_vocab_ce"], {"vocab": 35})) == -100


def test_case_file_covers_kl_and_the_module():
    cases = load_file(CASE_FILE)
    kl = [c for c in cases if c.subject == "ds_vocab_kl"]
    same = [c for c in kl if c["kl_shards"] == "same" and not c.expect.is_error and c["inf_rows"] == "none"]
    assert {c["reverse"] for c in same} == {False, True}
    assert {c["dtype"] for c in same} == {"fp32", "bf16"}
    assert {c["tp"] for c in same} == {2, 3}
    assert {c["kl_grad"] for c in same} == {"student", "teacher", "both"}
    assert any(len(set(shard_sizes(c["vocab"], c["tp"]))) > 1 for c in same)  # uneven
    assert any(len(set(shard_sizes(c["vocab"], c["tp"]))) == 1 for c in same)  # even
    infs = [c for c in kl if c["inf_rows"] != "none"]
    assert {c["inf_rows"] for c in infs} == {"all", "masked"} and all(c.divergence is not None for c in infs)
    other = [c for c in kl if c["kl_shards"] != "same"]
    assert {c["kl_shards"] for c in other} == {"shifted", "reversed"} and all(c.expect.is_error for c in other)
    assert all(c.divergence is not None for c in other if c["kl_shards"] == "shifted")
    module = [c for c in cases if c.subject == "ds_vocab_ce_module"]
    assert {c["reduction"] for c in module} == {"none", "sum", "mean"}
    assert {c["backend"] for c in module} == {"torch", "liger"}
    assert {c["ignore_index"] for c in module} == {0}  # not the default: a dropped ignore_index changes the loss
    assert len(kl) + len(module) <= 28


# -- the comparison, fed observations made from the reference (no ranks) ------------------------

KL = resolve(SUBJECTS["ds_vocab_kl"], {"dtype": "bf16", "reverse": True, "vocab": 32, "kl_grad": "both",
                                      "kl_shards": "same", "tp": 3, "device": "cpu"})


def _failed(subject, values, obs):
    return [c.name for c in compare(subject, values, obs, *reference_pair(subject, values)) if not c.passed]


def test_faithful_kl_observations_pass():
    subject = SUBJECTS["ds_vocab_kl"]
    assert _failed(subject, KL, _observations(subject, KL)) == []


def test_the_other_direction_is_caught():
    subject = SUBJECTS["ds_vocab_kl"]
    swapped = subject.reference(KL.replace(reverse=False))
    failed = _failed(subject, KL, _observations(subject, KL, reference=swapped))
    assert {"loss", "student_grad", "teacher_grad"} <= set(failed)


def test_an_ignored_upstream_is_caught():
    subject = SUBJECTS["ds_vocab_kl"]
    _, _, upstream = kl_inputs(SEED, TOKENS, 32, torch.bfloat16)
    weights = upstream.numpy()[:, None]
    obs = _observations(subject, KL, plant=lambda k, a: a / weights if k == "teacher_grad" else a)
    assert "teacher_grad" in _failed(subject, KL, obs)


def test_a_mean_over_tokens_is_caught():
    subject = SUBJECTS["ds_vocab_kl"]
    obs = _observations(subject, KL, plant=lambda k, a: a * 0 + a.mean() if k == "loss" else a)
    assert "loss" in _failed(subject, KL, obs)


@pytest.mark.parametrize("inf_rows", ["all", "masked"])
@pytest.mark.parametrize("reverse", [False, True])
def test_kl_reference_with_inf_logits_is_torch_kl_div(inf_rows, reverse):
    # nan and +inf exactly where F.kl_div(log_target=True) on log_softmax has them, the finite rest its value.
    s, t, _ = kl_inputs(SEED, TOKENS, 35, torch.float32, inf_rows)
    want = _torch_kl(s, t, reverse)
    got = kl_reference(SEED, TOKENS, 35, reverse, "both", torch.float32, inf_rows=inf_rows).get("loss", 0, 0, 0, None)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=1e-6, check_dtype=False)
    rows = {"all": [1, 2, 3], "masked": [4, 5, 6]}[inf_rows]  # nan, or +inf where only the other side masks an id
    assert not want[rows].isfinite().any() and want[[0, 7]].isfinite().all()
