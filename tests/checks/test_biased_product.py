"""A biased head's product (parity/checks/tolerances.py): `x @ w.T + b` rounded twice in bf16 is plain
PyTorch as much as F.linear's one rounding; the logits stage's floor is relative to the larger of the
logit and the product, so a bias that cancels the product does not make the rounding of x w^T a failure,
and an error beyond that rounding still is one."""
import numpy as np
import torch

from parity.checks import stages
from parity.checks.tolerances import judge_close


def _cancelling_head():
    """One vocabulary row (a one-row shard) whose bias cancels most of x w^T on every token: the tokens'
    head inputs share a large common part."""
    g = torch.Generator().manual_seed(0)
    common = torch.randn(1, 19, generator=g)
    x = (common + 0.02 * torch.randn(12, 19, generator=g)).bfloat16()
    w = (0.05 * common + 0.01 * torch.randn(1, 19, generator=g)).bfloat16()
    b = -(common.double() @ w.double().t()).reshape(1).bfloat16()
    return x, w, b


def _stage(x, w, b):
    """The logits stage's oracle, its bf16 reference (F.linear) and the bias-free product x w^T."""
    xs, ws, bs = (t.double().numpy() for t in (x, w, b))
    return (stages.logits_from_head_input(xs, ws, bs, torch.float64),
            stages.logits_from_head_input(xs, ws, bs, torch.bfloat16),
            stages.logits_from_head_input(xs, ws, None, torch.float64))


def test_rounding_the_product_before_the_bias_passes_only_with_the_product_as_scale():
    x, w, b = _cancelling_head()
    oracle, ref, product = _stage(x, w, b)
    got = ((x @ w.t()) + b).double().numpy()  # Megatron's and DeepSpeed's order: two bf16 roundings
    assert np.abs(product).max() > 4 * np.abs(oracle).max()  # the premise: the bias cancels the product
    assert not judge_close(got, ref, oracle, "bf16", inherits=False).passed
    assert judge_close(got, ref, oracle, "bf16", inherits=False, rounded_at=product).passed


def test_an_error_of_a_few_percent_of_the_product_still_fails():
    x, w, b = _cancelling_head()
    oracle, ref, product = _stage(x, w, b)
    wrong = oracle + 0.1 * np.abs(product).max()  # a bias applied 10% off the product's size
    assert not judge_close(wrong, ref, oracle, "bf16", inherits=False, rounded_at=product).passed


def test_without_a_cancelling_bias_the_scale_is_the_logits_own():
    # A product smaller than the logit changes nothing: a max bound of 4 reference errors (2^-9 relative)
    # and 16 bf16 units (2^-4) of max|oracle| passes 6% off and fails 8% off, with or without it.
    rng = np.random.default_rng(2)
    oracle = rng.normal(size=(4, 3))  # under ELEMENTWISE_MIN_SIZE: the max criterion alone
    ref = oracle * (1 + 2 ** -9)
    for rounded_at in (None, oracle * 0.5):
        assert judge_close(oracle * 1.06, ref, oracle, "bf16", inherits=False, rounded_at=rounded_at).passed
        assert not judge_close(oracle * 1.08, ref, oracle, "bf16", inherits=False, rounded_at=rounded_at).passed
