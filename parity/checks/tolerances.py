"""Every numerical bound the suite applies, in one place.

A subject's value is compared with the float64 oracle (the same reference model and data, the
same initial weights, no rounding after them). The bound for that error is

    bound = SHARDING_SLACK * reference_error + FLOOR_ULPS * unit_roundoff(dtype) * max|oracle|

- reference_error = max|reference at the case dtype - oracle|: the error an *unsharded* run at
  this precision makes. Sharding changes reduction order (a vocab split changes the softmax
  denominator's summation, the all-reduce sums partial products in another order), so a correct
  sharded run makes an error of the same size but in different places; SHARDING_SLACK allows for
  that. This scales the bound with depth, steps and precision without a hand-tuned table.
- The floor covers quantities that the reference computes exactly (reference_error == 0) but a
  sharded run computes through a different summation order: a few rounding units of the
  largest magnitude involved (errors in a sum are bounded relative to its terms, not its result).

Checks that involve no arithmetic are exact (bound 0): initial shard slices, replicated tensors
agreeing across ranks, and the SGD identity w' = w - lr * g in float32. In bf16/fp16 the SGD
identity is checked against one rounding unit of the weight, since the update goes through
float32 master weights and one cast back; with gradient clipping, one unit more for the rounded
clip coefficient.

Beside that max criterion, two criteria that look at elements (issue 15), on tensors large
enough for their statistics (ELEMENTWISE_MIN_SIZE):

- RMS: rms(x - oracle) <= RMS_SLACK * rms(ref - oracle) + RMS_FLOOR_ULPS * u * rms(oracle).
  A systematic error (a scale, a lost bit of precision) moves every element; the RMS of a correct
  run's error is that of the reference's to within a small factor, since both are sums of many
  roundings of the same kind (a law-of-large-numbers estimate, so only on many elements). This is
  what catches a relative scale of a few unit roundoffs, which the max criterion's floor hides.
- element-wise: |x_i - oracle_i| <= ELEMENT_SLACK * (|ref_i - oracle_i| + rms(ref - oracle))
                                    + ELEMENT_FLOOR_ULPS * u * (|oracle_i| + rms(oracle)).
  Each element against its own magnitude and its own reference error: a corrupted small entry no
  longer hides under the largest one. rms(ref - oracle) is the element's neighbourhood: a correct
  run may round an element the reference happened to get exactly (|ref_i - oracle_i| = 0), or one
  that cancels (|oracle_i| ~ 0, while the rounding is relative to the terms of its sum, whose
  size the reference's typical error measures); ELEMENT_SLACK is wide because it is a maximum over
  every element of a ratio of two rounding errors. (The typical *error*, not the typical value:
  rms(oracle) would let an entry a hundred times smaller than the typical one be anything.)

u is the unit roundoff of the *floor dtype*: the least precise rounding on the path from the
reference's exact inputs to that tensor (references.trajectory.Trajectory.floor_dtypes): the case
dtype for everything a training step produces (logits are rounded to it and everything downstream
inherits that), float32 for a loss the reference computes in float32 from exact case-dtype logits
(the loss-only subjects, and the stage-local loss below).

Stage-local oracles (parity/checks/stages.py): a stage re-evaluated in float64 on the *subject's
own* inputs to it (its recorded logits and targets -> loss; logits and head weight -> head-input
gradient), against the same stage at the case dtype done the reference's way on those inputs.
No upstream rounding is inherited, so the bound is the stage's own arithmetic: the same three
criteria, with the stage reference's error and the floor of the dtype the stage computes in.

The constants were measured on the default matrix (`parity run --report DIR` records every
measured/bound ratio in summary.json, `worst_ratio`), not guessed; see README "Tolerances";
`parity sensitivity` measures what they let through (README "Sensitivity").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from parity.observe.dtypes import DTYPES

SHARDING_SLACK = 4.0
FLOOR_ULPS = 16.0


# Element-wise and RMS criteria (see above); a tensor smaller than this has too few elements for an
# RMS to estimate an error's size: the max criterion alone judges it (a scalar loss).
ELEMENTWISE_MIN_SIZE = 32
RMS_SLACK = 2.0
RMS_FLOOR_ULPS = 1.0
ELEMENT_SLACK = 16.0
ELEMENT_FLOOR_ULPS = 4.0


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
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


def judge_close(got: np.ndarray, ref: np.ndarray, oracle: np.ndarray, floor_dtype) -> Judgement:
    """Every criterion above for one tensor; passes when all pass. ``floor_dtype``: a name or torch dtype."""
    if not got.size:
        return Judgement(True, "max", 0.0, 0.0)
    u = unit_roundoff(floor_dtype)
    diff, ref_err = np.abs(got - oracle), np.abs(ref - oracle)
    scale = np.abs(oracle)
    bound = parity_bound(floor_dtype, float(ref_err.max()), float(scale.max())).value
    results = [Judgement(float(diff.max()) <= bound, "max", float(diff.max()), bound)]
    if got.size >= ELEMENTWISE_MIN_SIZE:
        rms_err, rms_scale = _rms(ref_err), _rms(oracle)
        rms_bound = RMS_SLACK * rms_err + RMS_FLOOR_ULPS * u * rms_scale
        results.append(Judgement(_rms(diff) <= rms_bound, "rms", _rms(diff), rms_bound))
        element_bound = ELEMENT_SLACK * (ref_err + rms_err) + ELEMENT_FLOOR_ULPS * u * scale
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(element_bound > 0, diff / element_bound, np.where(diff > 0, np.inf, 0.0))
        worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        results.append(Judgement(bool(ratio[worst] <= 1), "element", float(diff[worst]), float(element_bound[worst]),
                                 tuple(int(i) for i in worst)))

    def ratio_of(j):
        return 0.0 if j.measured == 0 else (np.inf if j.bound == 0 else j.measured / j.bound)

    worst = max(results, key=ratio_of)
    return Judgement(all(j.passed for j in results), worst.criterion, worst.measured, worst.bound, worst.index)


def sgd_identity_bound(dtype_name: str, weight_scale: float, clipped: bool = False) -> float:
    if dtype_name == "fp32" and not clipped:
        return 0.0
    # bf16/fp16: the master weight is within half a unit of the model weight, plus the cast back:
    # one unit in all. Clipping scales the gradient by a rounded coefficient first: one more unit.
    units = (2 if dtype_name != "fp32" else 0) + (2 if clipped else 0)
    return units * unit_roundoff(dtype_name) * weight_scale


# -- Reading the ratios (reports and run comparison; nothing here decides a verdict) ------------
# A case is "near-failing" when its worst measured/bound ratio reaches this fraction of the bound:
# report.html plots it next to the failures. Passing cases of the default matrix reach 0.21 in fp32
# and 0.77 in bf16/fp16 (README "Tolerances"), so half the bound singles out the low-precision
# cases closest to it and an fp32 case whose error has doubled.
NEAR_FAILING_RATIO = 0.5
# `parity diff` lists a case whose worst ratio moved by at least this much, absolute, in units of
# its bound. Absolute, not a factor: ratios are already normalised by the bound, and a factor
# would flag 1e-4 -> 1e-3 (irrelevant) as loudly as 0.3 -> 0.9 (nearly failing).
RATIO_CHANGE = 0.1

# `parity sensitivity` (parity/sensitivity.py): the systematic relative error (x -> (1 + eps) x on
# one rank) every check kind must catch, per case dtype (issue 15). A few unit roundoffs of the
# dtype: fp32 u = 6e-8, bf16 u = 3.9e-3, fp16 u = 4.9e-4.
SENSITIVITY_TARGETS = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}

# `parity sensitivity` (parity/sensitivity.py): the systematic relative error (x -> (1 + eps) x on
# one rank) every check kind must catch, per case dtype (issue 15). A few unit roundoffs of the
# dtype: fp32 u = 6e-8, bf16 u = 3.9e-3, fp16 u = 4.9e-4.
SENSITIVITY_TARGETS = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}
