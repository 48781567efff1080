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

The constants were measured on the default matrix (`parity run --report DIR` records every
measured/bound ratio in summary.json, `worst_ratio`), not guessed; see README "Tolerances".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.observe.dtypes import DTYPES

SHARDING_SLACK = 4.0
FLOOR_ULPS = 16.0


def unit_roundoff(dtype_name: str) -> float:
    """Half the distance from 1.0 to the next representable value."""
    return float(torch.finfo(DTYPES[dtype_name]).eps) / 2


@dataclass(frozen=True)
class Bound:
    value: float
    reference_error: float
    scale: float

    def describe(self) -> str:
        return (f"{SHARDING_SLACK:g} x ref_err {self.reference_error:.3g} + {FLOOR_ULPS:g} ulp x scale "
                f"{self.scale:.3g}")


def parity_bound(dtype_name: str, reference_error: float, scale: float) -> Bound:
    value = SHARDING_SLACK * reference_error + FLOOR_ULPS * unit_roundoff(dtype_name) * scale
    return Bound(value, reference_error, scale)


def sgd_identity_bound(dtype_name: str, weight_scale: float, clipped: bool = False) -> float:
    if dtype_name == "fp32" and not clipped:
        return 0.0
    # bf16/fp16: the master weight is within half a unit of the model weight, plus the cast back:
    # one unit in all. Clipping scales the gradient by a rounded coefficient first: one more unit.
    # weight_scale: the larger magnitude of the weights before and after the update (the master's
    # half unit is relative to the weight before, the cast's to the weight after).
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
