"""A row's shared rounding (parity/checks/tolerances.py): the bound of each token's log-sum-exp rounding,
carried into the head-gradient stage by its probabilities and head input, widens that stage's RMS bound
by its RMS and nothing else."""
import numpy as np
import torch

from parity.checks import stages
from parity.checks.tolerances import judge_close, lse_shared_error, unit_roundoff

U32 = unit_roundoff("fp32")


def _logits_and_dz():
    rng = np.random.default_rng(0)
    z = (rng.normal(size=(5, 7)) * 0.5).astype(np.float32).astype(np.float64)
    targets = np.array([1, 6, -100, 0, 3])
    counted = targets != -100
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.zeros_like(p)
    onehot[np.flatnonzero(counted), targets[counted]] = 1.0
    scale = np.where(counted, 1.0 / counted.sum(), 0.0)[:, None]
    return z.astype(np.float32), torch.from_numpy((p - onehot) * scale), p, scale


def test_each_entry_carries_its_tokens_shared_error_by_its_probability_and_loss_scale():
    z, dz, p, scale = _logits_and_dz()
    z64 = z.astype(np.float64)
    row_max = z64.max(-1, keepdims=True)
    lse = row_max + np.log(np.exp(z64 - row_max).sum(-1, keepdims=True))
    want = p * scale * lse_shared_error(row_max, lse, U32)
    got = stages.shared_rounding_weights(z, dz, U32)
    np.testing.assert_allclose(got, want, rtol=1e-12)  # the target's entry too: p s e, not (p - 1) s e
    assert not got[2].any()  # an ignored token has no loss scale


def test_tokens_add_in_quadrature():
    w = np.array([[3.0, 1.0], [4.0, 0.0]])  # two tokens, two vocabulary rows
    x = np.array([[1.0], [1.0]])  # one hidden column
    weight, bias = stages.head_grad_shared_rms([w], [x], with_bias=True)
    np.testing.assert_allclose(weight[:, 0], [5.0, 1.0])
    np.testing.assert_allclose(bias, [5.0, 1.0])


def test_shared_rms_widens_the_rms_bound_only_by_itself():
    rng = np.random.default_rng(1)
    oracle = rng.normal(size=(40, 2)) * 1e-3
    ref = oracle * (1 + U32 * rng.uniform(-1, 1, size=oracle.shape))
    rms_scale = float(np.sqrt(np.mean(oracle ** 2)))
    common = 6 * U32 * rms_scale  # one sign down the tensor: beyond 2 x the reference's plus the floor
    got = oracle + common
    assert not judge_close(got, ref, oracle, "fp32", inherits=False).passed
    assert judge_close(got, ref, oracle, "fp32", inherits=False, shared_rms=common).passed
    # ...and no further: ten times that shared error still fails the same widened bound.
    assert not judge_close(oracle + 10 * common, ref, oracle, "fp32", inherits=False, shared_rms=common).passed
