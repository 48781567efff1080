"""The backward axis: the reference's twice/create_graph semantics, and ids unchanged at the default."""
import pytest
import torch

from parity.matrix.cases import load
from references.cross_entropy import SCALAR_UPSTREAM, ce_inputs, ce_reference, hvp_direction

SEED, TOKENS, VOCAB = 4321, 24, 35


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_twice_is_exactly_double(reduction):
    once = ce_reference(SEED, TOKENS, VOCAB, "scattered", torch.float32, reduction=reduction)
    twice = ce_reference(SEED, TOKENS, VOCAB, "scattered", torch.float32, reduction=reduction, backward="twice")
    g1, g2 = (t.get("logits_grad", 0, 0, 0, None) for t in (once, twice))
    assert torch.equal(g2, 2 * g1)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_create_graph_hvp_is_the_softmax_hessian(reduction):
    traj = ce_reference(SEED, TOKENS, VOCAB, "scattered", torch.float32, torch.float64, reduction=reduction,
                        backward="create_graph")
    logits, targets, upstream = ce_inputs(SEED, TOKENS, VOCAB, "scattered", torch.float32)
    p = torch.softmax(logits.double(), dim=-1)
    v = hvp_direction(SEED, TOKENS, VOCAB).double()
    valid = (targets != -100).double()
    if reduction == "none":
        weight = upstream.double() * valid
    else:
        scale = SCALAR_UPSTREAM / (valid.sum() if reduction == "mean" else 1.0)
        weight = scale * valid
    want = weight[:, None] * (p * v - p * (p * v).sum(-1, keepdim=True))
    assert torch.allclose(traj.get("logits_hvp", 0, 0, 0, None), want, atol=1e-12)
    once = ce_reference(SEED, TOKENS, VOCAB, "scattered", torch.float32, torch.float64, reduction=reduction)
    assert torch.allclose(traj.get("logits_grad", 0, 0, 0, None), once.get("logits_grad", 0, 0, 0, None))


def test_default_backward_renames_no_case():
    ids = [c.id for c in load() if c.subject in ("ds_vocab_ce", "liger_vocab_ce", "ds_liger_ce")]
    assert not any("bwd_once" in i for i in ids)
    assert any(i.endswith("bwd_twice") for i in ids) and any(i.endswith("bwd_create_graph") for i in ids)


def test_direct_subjects_claim_what_the_engine_subjects_claim():
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve

    def claims(name, values):  # the axes of ``values`` the subject declares (the column and row heads: no backend)
        return SUBJECTS[name].claims(resolve(SUBJECTS[name], {a: v for a, v in values.items()
                                                              if a in SUBJECTS[name].axes}))

    for direct, engine in [("direct_column_gathered", "column_gathered"), ("direct_vocab_parallel", "vocab_parallel"),
                           ("direct_row_parallel", "row_parallel")]:
        values = {"backend": "torch", "dtype": "fp32", "reduction": "mean", "vocab": 35, "hidden": 35, "bias": True,
                  "head": "lm_head", "ignore": "scattered", "zero": 0, "gas": 2, "tp": 2, "dp": 1, "grain": 1,
                  "clip": 0.0, "device": "cpu"}
        a, b = claims(direct, values), claims(engine, values)
        assert (a.module_types, a.param_shards, a.micro_records, a.loss_backend) == \
               (b.module_types, b.param_shards, b.micro_records, b.loss_backend)
