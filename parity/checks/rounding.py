"""Rounding samples: the case-dtype reference rerun with other, equally valid roundings (Monte Carlo arithmetic:
every rounding op's result moved by up to a unit of its dtype; sample i uses seed i). Why, and what it was
measured against: docs/tolerances.md#rounding-samples."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parity.checks.bounded_cache import BoundedCache
from parity.observe.records import RECORDS
from parity.checks.one_thread import one_torch_thread
from references.seeding import making_inputs
from references.trajectory import Trajectory

# The aten ops whose floating result is a rounded value, by name; an in-place variant ("add_", the
# gradient accumulation and the SGD update) is its op's name with a trailing underscore.
ROUNDING_OPS = frozenset({
    "add", "sub", "rsub", "mul", "div", "reciprocal", "pow", "sqrt", "rsqrt", "exp", "expm1", "log", "log1p",
    "tanh", "tanh_backward", "sigmoid", "xlogy", "mm", "addmm", "bmm", "baddbmm", "addcmul", "addcdiv", "sum",
    "mean", "logsumexp", "linalg_vector_norm", "_softmax", "_log_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward", "embedding_dense_backward",
    "index_add", "scatter_add", "_to_copy",
})


def _rounds(func) -> bool:
    name = func._schema.name.split("::")[-1]
    return name in ROUNDING_OPS or (name.endswith("_") and name[:-1] in ROUNDING_OPS)


# id(func) -> (func, rule), rule None where its result is not a rounded value, else (is it a cast, is it in-place):
# decided once per op (docs/tolerances.md#rounding-samples). The entry keeps func alive, so its id stays its own.
_RULES: dict = {}


def _rule(func):
    known = _RULES.get(id(func))
    if known is None:
        rule = (func._schema.name == "aten::_to_copy", func._schema.is_mutable) if _rounds(func) else None
        known = _RULES[id(func)] = (func, rule)
    return known[1]


_HALF_EPS: dict = {}  # dtype -> its unit roundoff, eps / 2


def _unit_roundoff(dtype) -> float:
    try:
        return _HALF_EPS[dtype]
    except KeyError:
        return _HALF_EPS.setdefault(dtype, torch.finfo(dtype).eps / 2)


class RoundingNoise(TorchDispatchMode):
    """Moves every rounding op's result by up to one unit roundoff of its dtype (see the module docstring)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo, a wrapper on every op
        # (and, on first use, Dynamo's import, seconds of the parent's CPU); nothing here is compiled.
        return False

    def __init__(self, seed: int):
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        rule = _rule(func)
        if rule is None or making_inputs():  # making_inputs: the reference's exact inputs, the subject's too
            return out
        first = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(first, torch.Tensor) or not first.is_floating_point() or not first.numel() or first.is_meta:
            return out  # a meta tensor (a model built on the meta device, then loaded) holds no values to round
        cast, in_place = rule
        if cast:
            source = args[0]
            if not source.is_floating_point() or _unit_roundoff(first.dtype) <= _unit_roundoff(source.dtype):
                return out  # a widening or same-precision cast is exact
        # first * (1 + u r), r uniform in [-1, 1), in float64, rounded back: the same operations, in
        # place on the draw (one tensor instead of five).
        r = torch.rand(first.shape, generator=self.generator, dtype=torch.float64)
        moved = r.mul_(2).sub_(1).mul_(_unit_roundoff(first.dtype)).add_(1).mul_(first).to(first.dtype)
        if in_place:  # in-place (add_, sub_, out=): the mutated tensor is what the caller holds
            first.copy_(moved)
            return out
        return type(out)([moved, *out[1:]]) if isinstance(out, (tuple, list)) else moved


# The oracle has no float32 master: a rerun's record is measured against the oracle's kind the schema names
# (a master against the weights: docs/tolerances.md#master-weights).
ORACLE_KIND = {k.name: k.oracle for k in RECORDS.values() if k.oracle}


def sampled_error(subject, values: dict, oracle: Trajectory, samples: int) -> Trajectory:
    """Per record, |rerun - oracle| of each of ``samples`` perturbed case-dtype reruns, stacked along a new
    first dimension (parity.checks.tolerances.judge_close reads it)."""
    errors: dict = {}
    for seed in range(samples):
        with RoundingNoise(seed):
            run = subject.reference(values)
        for key, value in run.records.items():
            exact = oracle.records.get((ORACLE_KIND.get(key[0], key[0]), *key[1:]))
            if exact is not None:
                errors.setdefault(key, []).append((value - exact).abs())
    spread = Trajectory()
    spread.records = {key: torch.stack(each) for key, each in errors.items() if len(each) == samples}
    return spread


# Computed on a miss that needs them, then shared as the references are (docs/tolerances.md#rounding-samples).
SPREAD_CACHE_SIZE = 64
_cache = BoundedCache(lambda: SPREAD_CACHE_SIZE)


def cached_sampled_error(subject, values: dict, oracle: Trajectory, samples: int) -> Trajectory:
    key = subject.reference_key(values)
    spread = _cache.get(key)
    if spread is None:
        with one_torch_thread():  # as the reference itself (parity/checks/one_thread.py)
            spread = sampled_error(subject, values, oracle, samples)
        _cache.put(key, spread)
    return spread


def clear_cache() -> None:
    _cache.clear()
