"""The optimizer-side stage bounds (parity/checks/tolerances.py, docs/tolerances.md#optimizer-stages): each holds the
stage done in its own dtype and fails the same stage with one more rounding of a coarser dtype planted in it."""
import numpy as np
import torch

from parity.checks.optimizer_stages import _held
from parity.checks.tolerances import accumulation_bound, clip_stage_bound, reduction_bound, step_stage_bound


def _rng(seed=0):
    return torch.Generator().manual_seed(seed)


def _passes(got, want, bound) -> bool:
    return _held("x", got, want, bound)["passed"]


def test_accumulation_in_its_dtype_passes_and_a_bf16_rounding_fails():
    micros = [torch.randn(4000, generator=_rng(i)).to(torch.bfloat16).float() for i in range(2)]
    want = (micros[0].double() + micros[1].double()).numpy()
    arrays = [m.double().numpy() for m in micros]
    fp32 = (micros[0] + micros[1]).double().numpy()
    assert _passes(fp32, want, accumulation_bound(arrays, "fp32"))
    assert not _passes((micros[0] + micros[1]).to(torch.bfloat16).double().numpy(), want,
                       accumulation_bound(arrays, "fp32"))
    bf16 = (micros[0].to(torch.bfloat16) + micros[1].to(torch.bfloat16)).double().numpy()
    assert _passes(bf16, want, accumulation_bound(arrays, "bf16"))


def test_reduction_one_replica_is_one_cast():
    g = torch.randn(4000, generator=_rng(1))
    bound = reduction_bound([g.double().numpy()], "bfloat16", "float32")
    assert _passes(g.to(torch.bfloat16).double().numpy(), g.double().numpy(), bound)
    assert not _passes(g.double().numpy() * (1 + 2 ** -7), g.double().numpy(), bound)
    assert not np.any(reduction_bound([g.double().numpy()], "float32", "float32"))  # D 1, one dtype: exact


def test_reduction_of_two_in_bf16():
    gs = [torch.randn(4000, generator=_rng(i)) for i in (2, 3)]
    got = ((gs[0].to(torch.bfloat16) * 0.5) + (gs[1].to(torch.bfloat16) * 0.5)).float().double().numpy()
    want = np.mean([g.double().numpy() for g in gs], axis=0)
    assert _passes(got, want, reduction_bound([g.double().numpy() for g in gs], "bfloat16", "float32"))


def test_step_in_float32_passes_and_a_bf16_increment_fails():
    w, g, lr = torch.randn(4000, generator=_rng(4)), torch.randn(4000, generator=_rng(5)), 0.01
    new = w.clone().add_(g, alpha=-lr)
    want = w.double().numpy() - lr * g.double().numpy()
    bound = step_stage_bound(want, lr * g.double().numpy(), "float32")
    assert _passes(new.double().numpy(), want, bound)
    planted = (w + (new - w).to(torch.bfloat16).float()).double().numpy()
    assert not _passes(planted, want, bound)


def test_clip_coefficient_rounded_to_bf16_fails():
    g = torch.randn(4000, generator=_rng(6)).to(torch.bfloat16).float()
    coefficient = 0.0123456789
    want = g.double().numpy() * coefficient
    bound = clip_stage_bound(g.double().numpy(), coefficient, 0.0, True)
    assert _passes((g * torch.tensor(coefficient, dtype=torch.float32)).double().numpy(), want, bound)
    rounded = torch.tensor(coefficient).to(torch.bfloat16).float()
    assert not _passes((g * rounded).double().numpy(), want, bound)
    assert not np.any(clip_stage_bound(g.double().numpy(), 1.0, 0.0, False))


def test_zero2_one_replica_accumulates_micros_as_its_reduction_cast_them():
    """ZeRO 2 reduces each micro-batch's gradient before accumulating it: at DP 1 with a bf16 reduction dtype the
    step gradient is the float32 sum of the bf16-cast micros, which the oracle holds once it casts them too."""
    from parity.checks.optimizer_stages import _reduced_one_replica

    micros = [torch.randn(4000, generator=_rng(i + 7)) for i in range(2)]
    got = (micros[0].to(torch.bfloat16).float() + micros[1].to(torch.bfloat16).float()).double().numpy()
    arrays = [m.double().numpy() for m in micros]
    assert not _passes(got, np.sum(arrays, axis=0), accumulation_bound(arrays, "fp32"))
    for scale in (1.0, 1024.0):  # the cast is of the loss-scaled values the rank held; records are unscaled
        cast = _reduced_one_replica([a / scale for a in arrays], "bfloat16", scale)
        assert _passes(got / scale, np.sum(cast, axis=0), accumulation_bound(cast, "fp32"))
    assert _reduced_one_replica(arrays, None, 1.0) is arrays


def test_an_overflow_in_the_stage_input_is_carried_on_not_a_failure():
    """A skipped fp16 step's micro-batch gradient holds inf: the accumulation passes it on; a stage that turns a
    finite input non-finite, or drops the inf, fails."""
    micros = [np.array([1.0, np.inf, -np.inf, 2.0]), np.array([1.0, 1.0, -1.0, np.nan])]
    want, bound = np.sum(micros, axis=0), accumulation_bound(micros, "fp32")
    assert _passes(np.array([2.0, np.inf, -np.inf, np.nan]), want, bound)
    assert not _passes(np.array([2.0, 3.0e38, -np.inf, np.nan]), want, bound)
    assert not _passes(np.array([np.inf, np.inf, -np.inf, np.nan]), want, bound)
