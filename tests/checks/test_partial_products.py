"""A sharded head's partial products (parity/checks/tolerances.py): a vocabulary-sharded head's input
gradient is each shard's dz W partial product rounded, then summed; the stage's floors scale with the
partials' magnitudes, so their roundings pass where the partials cancel, and an error beyond them fails."""
import numpy as np
import torch

from parity.checks import stages
from parity.checks.tolerances import judge_close

PARTS = [slice(0, 1), slice(1, 2), slice(2, 3)]  # vocabulary 3 over tp 3: one row a rank


def _cancelling_gradient():
    """dz [N, 3] summing to zero per token (a softmax gradient's shape), exact in bf16 (multiples of
    2^-8), against three similar weight rows: each partial dz_v w_v is exact in float32, so the
    unsharded reference rounds once, relative to the result, and the shards round their partials."""
    g = torch.Generator().manual_seed(0)
    k = torch.randint(-60, 61, (40, 2), generator=g).double()
    dz = torch.cat([k, -k.sum(dim=-1, keepdim=True)], dim=-1) / 256
    row = torch.randn(1, 3, generator=g)
    w = (row + 0.01 * torch.randn(3, 3, generator=g)).bfloat16().double()
    return dz, w.numpy()


def _sharded(dz, w):
    """Each rank's partial product rounded to bf16, then the all-reduce's bf16 adds."""
    total = None
    for part in PARTS:
        partial = (dz[:, part].bfloat16() @ torch.from_numpy(w[part]).bfloat16())
        total = partial if total is None else (total + partial)
    return total.double().numpy()


def test_the_partials_roundings_pass_only_with_the_partials_as_scale():
    dz, w = _cancelling_gradient()
    oracle = (dz @ torch.from_numpy(w)).numpy()
    ref = (dz.bfloat16() @ torch.from_numpy(w).bfloat16()).double().numpy()
    partials = stages.partial_products_magnitude(dz, w, PARTS)
    assert partials.max() > 10 * np.abs(oracle).max()  # the premise: the shards' partials cancel
    got = _sharded(dz, w)
    assert not judge_close(got, ref, oracle, "bf16", inherits=False).passed
    assert judge_close(got, ref, oracle, "bf16", inherits=False, rounded_at=partials).passed


def test_an_error_of_a_tenth_of_the_partials_still_fails():
    dz, w = _cancelling_gradient()
    oracle = (dz @ torch.from_numpy(w)).numpy()
    ref = (dz.bfloat16() @ torch.from_numpy(w).bfloat16()).double().numpy()
    partials = stages.partial_products_magnitude(dz, w, PARTS)
    wrong = oracle + 0.1 * partials  # a partial product a tenth off, one sign
    assert not judge_close(wrong, ref, oracle, "bf16", inherits=False, rounded_at=partials).passed


def test_partials_add_their_magnitudes():
    dz = torch.tensor([[1.0, -1.0]])
    w = np.array([[2.0], [2.0]])
    np.testing.assert_allclose(stages.partial_products_magnitude(dz, w, [slice(0, 1), slice(1, 2)]), [[4.0]])
    np.testing.assert_allclose(stages.partial_products_magnitude(dz, w, [slice(0, 2)]), [[0.0]])
