"""Every numerical bound the suite applies, in one place: each tensor meets the max, RMS and element-wise
criteria, multiples of the unsharded reference's own error plus a floor of unit roundoffs, which the rounding
samples may widen where they disprove a premise (judge_close). Why each bound has its form, and the evidence:
docs/tolerances.md#the-bounds-in-short."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from parity.observe.dtypes import DTYPES

# The max criterion (docs/tolerances.md#the-max-criterion).
SHARDING_SLACK = 4.0
FLOOR_ULPS = 16.0


# Element-wise and RMS criteria, on tensors of ELEMENTWISE_MIN_SIZE or more (docs/tolerances.md#the-rms-criterion).
ELEMENTWISE_MIN_SIZE = 32
RMS_SLACK = 2.0
# An RMS miss beyond this factor is judged by the samples only where dispersed (docs/tolerances.md#the-samples-reach).
RMS_SAMPLED_REACH = 4.0
RMS_FLOOR_ULPS = 1.0
ELEMENT_SLACK = 16.0
ELEMENT_FLOOR_ULPS = 4.0
# Reruns of the reference with random roundings (docs/tolerances.md#small-tensors-and-the-sampled-max: why eight).
ROUNDING_SAMPLES = 8
# The RMS error of one rounding of every value, in units of u x rms(oracle) (docs/tolerances.md#the-rms-criterion).
ONE_ROUNDING_RMS = 3 ** -0.5
# Samples whose RMS errors spread beyond DISPERSED_SPREAD say fewer than MIN_RMS_SOURCES roundings make the
# error (docs/tolerances.md#dispersed-samples).
MIN_RMS_SOURCES = 4
EXPECTED_RANGE_OF_8_NORMALS = 2.847
DISPERSED_SPREAD = float(np.exp(EXPECTED_RANGE_OF_8_NORMALS / np.sqrt(2 * MIN_RMS_SOURCES)))


# Standard deviations of two runs' log RMS ratio a few-source tensor's slack allows (docs/tolerances.md#few-sources).
FEW_SOURCE_Z = 3.0


# How wide Monte Carlo arithmetic's samples err, and the most RMS error (in one-roundings) a sample gives values
# rounded once (docs/tolerances.md#a-reference-that-rounded-luckily).
SAMPLES_WIDTH = 2.0
MCA_ONE_ROUNDING = 1.5


@functools.lru_cache(maxsize=None)  # called about 500 times a case with a handful of dtypes
def unit_roundoff(dtype_name) -> float:
    """Half the distance from 1.0 to the next representable value (a name "bf16" or a torch dtype)."""
    dtype = DTYPES[dtype_name] if isinstance(dtype_name, str) else dtype_name
    return float(torch.finfo(dtype).eps) / 2


@dataclass(frozen=True)
class Bound:
    value: float
    reference_error: float
    scale: float

    def describe(self) -> str:
        return (f"{SHARDING_SLACK:g} x ref_err {self.reference_error:.3g} + {FLOOR_ULPS:g} ulp x scale "
                f"{self.scale:.3g}")


def parity_bound(dtype_name, reference_error: float, scale: float) -> Bound:
    value = SHARDING_SLACK * reference_error + FLOOR_ULPS * unit_roundoff(dtype_name) * scale
    return Bound(value, reference_error, scale)


def master_weight_bound(dtype_name: str, reference_error: float, scale: float, movement: float) -> Bound:
    """A float32 master's bound: a float32 floor on its value and a case-dtype floor on ``movement`` =
    max|oracle - initial| (docs/tolerances.md#master-weights)."""
    value = (SHARDING_SLACK * reference_error + FLOOR_ULPS * unit_roundoff("fp32") * scale
             + FLOOR_ULPS * unit_roundoff(dtype_name) * movement)
    return Bound(value, reference_error, scale)


def master_weight_sampled_bound(dtype_name: str, first: Bound, sampled_error: float, movement: float) -> Bound | None:
    """The master bound with the rounding samples' error as the reference error, or None where the samples
    do not disprove the floor's premise (docs/tolerances.md#master-weights)."""
    if sampled_error <= max(first.reference_error, FLOOR_ULPS * unit_roundoff(dtype_name) * movement):
        return None
    return master_weight_bound(dtype_name, sampled_error, first.scale, movement)


@dataclass(frozen=True)
class Judgement:
    """The worst of the criteria a tensor was held to: the one with the highest measured/bound."""
    passed: bool
    criterion: str  # "max", "rms" or "element"
    measured: float
    bound: float
    index: tuple | None = None  # the element, for the element-wise criterion

    def describe(self) -> str:
        where = f" at {self.index}" if self.index is not None else ""
        return f"{self.criterion} criterion{where}"


def _rms(a: np.ndarray) -> float:
    if not a.size:
        return 0.0
    if a.dtype != np.float64:  # np.mean accumulates float16 in float32: keep its rules for other dtypes
        return float(np.sqrt(np.mean(a * a)))
    # np.mean's float64 result bit for bit, without its per-call dispatch (called about 700 times a case).
    return float(np.sqrt(np.add.reduce(a * a, axis=None) / a.size))


def _whole_samples(sampled_error) -> tuple[np.ndarray, float] | None:
    """(errors, max|oracle|) of the whole tensor a shard was cut from; None where sampled_error offers none."""
    whole = getattr(sampled_error, "whole", None)
    return None if whole is None else whole()


def lucky_stand_in(errors: np.ndarray | None, rms_err: float, one_rounding: float,
                   inherits: bool = False) -> float | None:
    """The smallest sample's RMS error over SAMPLES_WIDTH where the reference rounded luckily, else None
    (docs/tolerances.md#a-reference-that-rounded-luckily; docs/tolerances.md#an-inherited-errors-lucky-draw)."""
    if errors is None or not len(errors):
        return None
    smallest = min(_rms(e) for e in errors)
    if smallest <= MCA_ONE_ROUNDING * one_rounding:
        return None
    stand_in = smallest / SAMPLES_WIDTH
    lucky = rms_err < stand_in and (inherits or rms_err < one_rounding)
    return stand_in if lucky else None


def _samples(sampled_error, oracle: np.ndarray) -> np.ndarray | None:
    """The rounding samples' errors at the places of oracle, one per index of the first axis, or None."""
    errors = sampled_error()
    return errors if errors is not None and len(errors) and errors.shape[1:] == oracle.shape else None


def lse_shared_error(row_max: np.ndarray, lse: np.ndarray, u: float) -> np.ndarray:
    """The bound of each token's log-sum-exp rounding, shared by its row (docs/tolerances.md#a-rows-shared-rounding)."""
    return u * ((lse - row_max) + np.abs(lse))


def stage_rms_floor_ulps(floor_dtype) -> float:
    """A stage-local check's RMS floor in units of its floor dtype (docs/tolerances.md#a-stages-rms-floor)."""
    return RMS_FLOOR_ULPS if unit_roundoff(floor_dtype) <= unit_roundoff("fp32") else ONE_ROUNDING_RMS


def rms_bound(rms_err: float, u: float, rms_scale: float, inherits: bool = True,
              floor_ulps: float = RMS_FLOOR_ULPS, slack: float = RMS_SLACK) -> float:
    """The RMS criterion's bound; a stage-local check (``inherits`` False) holds all of the error to ``slack``, a
    few-source tensor's slack replaces RMS_SLACK (docs/tolerances.md#the-rms-criterion)."""
    if not inherits:
        return slack * rms_err + floor_ulps * u * rms_scale
    one_rounding = ONE_ROUNDING_RMS * u * rms_scale
    return (slack * min(rms_err, one_rounding) + max(SHARDING_SLACK, slack) * max(rms_err - one_rounding, 0.0)
            + RMS_FLOOR_ULPS * u * rms_scale)


def _sample_rms(errors: np.ndarray) -> list[float]:
    """Each sample's RMS error, the entries the oracle leaves nan dropped."""
    finite = np.isfinite(errors).all(axis=0)
    return [_rms(e) for e in (errors if finite.all() else errors[:, finite])]


def _spread(errors: np.ndarray) -> float | None:
    """max / min of the samples' RMS errors: inf where one sample is exact, None where all are."""
    each = _sample_rms(errors)
    if not each or max(each) == 0:
        return None
    return max(each) / min(each) if min(each) > 0 else float("inf")


def dispersed(errors: np.ndarray | None, trajectory=None) -> bool:
    """The samples' RMS errors further apart than DISPERSED_SPREAD, at this step or over the record's steps
    (``trajectory``; docs/tolerances.md#dispersed-samples)."""
    if errors is None:
        return False
    own = _spread(errors)
    if own is not None and own > DISPERSED_SPREAD:
        return True
    if trajectory is None:
        return False
    spreads = [s for s in map(_spread, trajectory()) if s is not None and np.isfinite(s)]
    return len(spreads) > 1 and float(np.exp(np.mean(np.log(spreads)))) > DISPERSED_SPREAD


def _log_rms_variance(errors: np.ndarray) -> float | None:
    """The variance (ddof 1) of the samples' log RMS errors; None where a sample is exact or fewer than two."""
    each = np.array(_sample_rms(errors))
    if len(each) < 2 or not (each > 0).all():
        return None
    return float(np.var(np.log(each), ddof=1))


def few_source_slack(errors: np.ndarray | None, trajectory=None) -> float:
    """The RMS slack a tensor's own rounding samples call for, never below RMS_SLACK
    (docs/tolerances.md#few-sources)."""
    if errors is None:
        return RMS_SLACK
    pooled = [v for v in map(_log_rms_variance, trajectory() if trajectory is not None else [errors])
              if v is not None]
    if not pooled:
        return RMS_SLACK
    sigma = float(np.sqrt(np.mean(pooled)))
    return max(RMS_SLACK, float(np.exp(FEW_SOURCE_Z * np.sqrt(2.0) * sigma)))


def _element_judgement(diff, ref_err, rms_err: float, u: float, scale, criterion: str) -> Judgement:
    element_bound = ELEMENT_SLACK * (ref_err + rms_err) + ELEMENT_FLOOR_ULPS * u * scale
    if element_bound.min() > 0:  # the usual case: no zero bound, so no 0/0 to guard (errstate costs)
        ratio = diff / element_bound
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(element_bound > 0, diff / element_bound, np.where(diff > 0, np.inf, 0.0))
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return Judgement(bool(ratio[worst] <= 1), criterion, float(diff[worst]), float(element_bound[worst]),
                     tuple(int(i) for i in worst))


def judge_close(got: np.ndarray, ref: np.ndarray, oracle: np.ndarray, floor_dtype, sampled_error=None,
                inherits: bool = True, shared_rms: float = 0.0, rounded_at: np.ndarray | None = None) -> Judgement:
    """Every criterion for one tensor; passes when all pass. ``floor_dtype``: a name or torch dtype
    (docs/tolerances.md#the-floor-dtype); ``sampled_error``: a callable giving the rounding samples' |rerun -
    oracle|, called only on a miss it may widen; ``inherits``: False for a stage-local check; ``shared_rms``
    (docs/tolerances.md#a-rows-shared-rounding) is added to the RMS bound; ``rounded_at``: per entry, an
    intermediate a valid evaluation rounds (docs/tolerances.md#a-biased-heads-product)."""
    if not got.size:
        return Judgement(True, "max", 0.0, 0.0)
    u = unit_roundoff(floor_dtype)
    diff, ref_err = np.abs(got - oracle), np.abs(ref - oracle)
    scale = np.abs(oracle) if rounded_at is None else np.maximum(np.abs(oracle), np.abs(rounded_at))
    max_diff, max_ref_err, max_scale = float(diff.max()), float(ref_err.max()), float(scale.max())
    bound = parity_bound(floor_dtype, max_ref_err, max_scale).value
    results = [Judgement(max_diff <= bound, "max", max_diff, bound)]
    if not results[0].passed and got.size < ELEMENTWISE_MIN_SIZE and sampled_error is not None:
        errors = _samples(sampled_error, oracle)
        sampled = 0.0 if errors is None else float(errors.max())
        # Only where the samples disprove the floor's premise (docs/tolerances.md#small-tensors-and-the-sampled-max),
        # a shard by its whole tensor (docs/tolerances.md#a-shard-gated-by-its-whole-tensor).
        cancels = sampled > max(max_ref_err, FLOOR_ULPS * u * max_scale)
        whole = _whole_samples(sampled_error) if errors is not None and not cancels else None
        if whole is not None and len(whole[0]):
            cancels = (sampled > max_ref_err
                       and float(whole[0].max()) > max(max_ref_err, FLOOR_ULPS * u * max(max_scale, whole[1])))
        if cancels:
            bound = parity_bound(floor_dtype, sampled, max_scale).value
            results = [Judgement(max_diff <= bound, "sampled max", max_diff, bound)]
    if got.size >= ELEMENTWISE_MIN_SIZE:
        rms_err, rms_scale = _rms(ref_err), _rms(scale)
        cancelling = None  # the samples' errors where they disprove the premise of both criteria below
        taken = []  # the rounding samples at the places of oracle, taken once, on the first miss that needs them

        def samples():
            if not taken:
                taken.append(_samples(sampled_error, oracle))
            return taken[0]

        def samples_disprove():
            """The samples' elementwise max error where it disproves the RMS premise, else None
            (docs/tolerances.md#large-tensors-and-the-sampled-rms)."""
            nonlocal cancelling
            if cancelling is None:
                errors = samples()
                cancelling = False
                if errors is not None:
                    largest = errors.max(axis=0)
                    if _rms(largest) > max(rms_err, FLOOR_ULPS * u * rms_scale):
                        cancelling = largest
            return None if cancelling is False else cancelling

        steps = getattr(sampled_error, "steps", None)
        trajectory = None if steps is None else functools.cache(steps)  # the RMS and element criteria share it

        @functools.cache
        def samples_dispersed() -> bool:  # asked by the max, RMS and element criteria alike
            return dispersed(samples(), trajectory)

        if not results[0].passed and sampled_error is not None and samples_dispersed():
            # Entries that share a few sources: the samples' largest error stands for the reference's
            # (docs/tolerances.md#the-max-criterion-of-a-few-source-tensor).
            sampled = float(samples().max())
            if sampled > max_ref_err:
                bound = parity_bound(floor_dtype, sampled, max_scale).value
                results = [Judgement(max_diff <= bound, "sampled max", max_diff, bound)]
        floor_ulps = RMS_FLOOR_ULPS if inherits else stage_rms_floor_ulps(floor_dtype)
        one_rounding = ONE_ROUNDING_RMS * u * rms_scale
        bound_rms = rms_bound(rms_err, u, rms_scale, inherits, floor_ulps) + shared_rms
        rms_diff = _rms(diff)
        rms_judged = Judgement(rms_diff <= bound_rms, "rms", rms_diff, bound_rms)
        if (not rms_judged.passed and sampled_error is not None
                and (rms_judged.measured <= RMS_SAMPLED_REACH * bound_rms or samples_dispersed())):
            # Only where the samples disprove the RMS's premise, by magnitude or by dispersion
            # (docs/tolerances.md#large-tensors-and-the-sampled-rms).
            errors = samples_disprove()
            if errors is not None:
                bound_rms = max(bound_rms, RMS_SLACK * _rms(errors) + floor_ulps * u * rms_scale + shared_rms)
                rms_judged = Judgement(rms_diff <= bound_rms, "sampled rms", rms_diff, bound_rms)
            elif samples_dispersed():
                bound_rms = max(bound_rms, RMS_SLACK * max(_rms(e) for e in samples()) + floor_ulps * u * rms_scale
                                + shared_rms)
                rms_judged = Judgement(rms_diff <= bound_rms, "dispersed rms", rms_diff, bound_rms)
            elif (stand_in := lucky_stand_in(samples(), rms_err, one_rounding, inherits)) is not None:
                bound_rms = max(bound_rms, rms_bound(stand_in, u, rms_scale, inherits, floor_ulps) + shared_rms)
                rms_judged = Judgement(rms_diff <= bound_rms, "lucky-reference rms", rms_diff, bound_rms)
            elif not inherits and (slack := few_source_slack(samples(), trajectory)) > RMS_SLACK:
                # Few sources, yet more than the dispersion test's; stage-local only (docs/tolerances.md#few-sources).
                bound_rms = max(bound_rms, rms_bound(rms_err, u, rms_scale, inherits, floor_ulps, slack) + shared_rms)
                rms_judged = Judgement(rms_diff <= bound_rms, "few-source rms", rms_diff, bound_rms)
        results.append(rms_judged)
        element = _element_judgement(diff, ref_err, rms_err, u, scale, "element")
        used = (ref_err, rms_err, "element")  # the reference errors the element criterion was held to
        if not element.passed and sampled_error is not None:
            # The same premise, element by element (docs/tolerances.md#large-tensors-and-the-sampled-rms).
            errors = samples_disprove()
            if errors is None and samples_dispersed():
                # Dispersed samples: one run's neighbourhood does not stand for another's
                # (docs/tolerances.md#dispersed-samples).
                errors = samples().max(axis=0)
            if errors is not None:
                used = (np.maximum(ref_err, errors), max(rms_err, _rms(errors)), "sampled element")
                element = _element_judgement(diff, *used[:2], u, scale, used[2])
            elif (stand_in := lucky_stand_in(samples(), rms_err, one_rounding, inherits)) is not None:
                # A lucky reference understates the neighbourhood too
                # (docs/tolerances.md#a-reference-that-rounded-luckily).
                used = (ref_err, stand_in, "lucky-reference element")
                element = _element_judgement(diff, *used[:2], u, scale, used[2])
        if not element.passed and diff.ndim >= 2 and diff.shape[-1] > 1:
            # The element's row as its neighbourhood where it errs more (docs/tolerances.md#a-rows-neighbourhood).
            rows = np.sqrt(np.mean(ref_err * ref_err, axis=-1, keepdims=True))
            if (rows > used[1]).any():
                element = _element_judgement(diff, used[0], np.maximum(used[1], rows), u, scale, "row " + used[2])
        results.append(element)

    def ratio_of(j):
        return 0.0 if j.measured == 0 else (np.inf if j.bound == 0 else j.measured / j.bound)

    worst = max(results, key=ratio_of)
    return Judgement(all(j.passed for j in results), worst.criterion, worst.measured, worst.bound, worst.index)


# A clipped update's float32 roundings, each relative to the update (docs/tolerances.md#the-sgd-identity).
CLIP_UPDATE_UNITS = 5


def sgd_identity_bound(dtype_name: str, weight_scale: float, clipped: bool = False, update_scale: float = 0.0,
                       coefficient_error: float = 0.0) -> float:
    """How far w' may be from w - lr g (g clipped); update_scale max |lr g| and coefficient_error (the check's
    coefficient against the subject's) matter only when clipped."""
    if dtype_name == "fp32" and not clipped:
        return 0.0
    # bf16/fp16: the master's half unit and the cast back; clipping one more (docs/tolerances.md#the-sgd-identity).
    units = (2 if dtype_name != "fp32" else 0) + (2 if clipped else 0)
    bound = units * unit_roundoff(dtype_name) * weight_scale
    if clipped:
        bound += (CLIP_UPDATE_UNITS * unit_roundoff("fp32") + coefficient_error) * update_scale
    return bound


def clip_coefficient_error(reports_norm: bool, entries: int) -> float:
    """Relative error of the check's clipping coefficient against the subject's: 0 with its reported norm, else
    from its float32 norm of ``entries`` values (docs/tolerances.md#the-sgd-identity)."""
    if reports_norm:
        return 0.0
    u32 = unit_roundoff("fp32")
    e = gamma(max(entries, 1), u32) + u32
    return e / (1 - e)


# Reading the ratios in reports and `parity diff`; neither decides a verdict (docs/tolerances.md#reading-the-ratios).
NEAR_FAILING_RATIO = 0.5
RATIO_CHANGE = 0.1


# -- Stage-local bounds of the scale cases (parity/scale/), from rounding-error analysis
# (docs/tolerances.md#production-scale-stage-bounds).
SPLIT_K_ROUNDINGS = 2.0
CE_UNITS = 6.0  # subtract, exp, divide, log, add, subtract: one rounding each
GRAD_OUT_UNITS = 3.0
LAMBDA = 10.0


def gamma(n: int, u: float) -> float:
    """Sum bound g(n, u): the smaller of the worst case n u / (1 - n u) and Higham & Mary's probabilistic
    one at LAMBDA (docs/tolerances.md#production-scale-stage-bounds)."""
    import math

    worst = n * u / (1 - n * u) if n * u < 1 else math.inf
    return min(worst, math.expm1(LAMBDA * math.sqrt(n) * u + n * u * u / (1 - u)))


def matmul_error_coeff(n: int, out_dtype: str) -> tuple[float, float]:
    """(coefficient of sum|a_k b_k|, coefficient of |result|) for a length-n product rounded to out_dtype."""
    u32, u_out = unit_roundoff("fp32"), unit_roundoff(out_dtype)
    split_k = SPLIT_K_ROUNDINGS * u_out if out_dtype != "fp32" else 0.0
    return gamma(n, u32) + split_k, u_out


def ce_sum_coeff(vocab: int) -> float:
    """Relative error of the fp32 sum of exponentials over `vocab` columns (an absolute error of its log)."""
    return gamma(vocab, unit_roundoff("fp32"))


def ce_unit_coeff() -> float:
    """Coefficient of the operand magnitudes for the fp32 CE's elementwise roundings."""
    return CE_UNITS * unit_roundoff("fp32")


def ce_grad_out_coeff(grad_dtype: str) -> float:
    """Coefficient of |dlogits| for the roundings after the softmax
    (docs/tolerances.md#production-scale-stage-bounds)."""
    cast = unit_roundoff(grad_dtype) if grad_dtype != "fp32" else 0.0
    return GRAD_OUT_UNITS * unit_roundoff("fp32") + cast


def sgd_error_coeff(weight_dtype: str) -> tuple[float, float]:
    """(coefficient of |w'|, coefficient of lr |g|) for one SGD step in the weight's dtype."""
    u_w = unit_roundoff(weight_dtype)
    return u_w, 2 * u_w

# The systematic relative error every check kind must catch, per case dtype (`parity sensitivity`;
# docs/tolerances.md#sensitivity-targets-and-planted-errors).
SENSITIVITY_TARGETS = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}
