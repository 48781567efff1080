"""Planted numerical errors ("scale", "element", "shard") on one rank's observations, for `parity sensitivity`
(docs/tolerances.md#sensitivity-targets-and-planted-errors)."""
from __future__ import annotations

import copy

import numpy as np

from parity.observe.partition import shard_slice

OBSERVABLES = {
    "loss": ("loss",),
    "logits": ("logits", "embedding"),
    "head_input_grad": ("head_input_grad", "hidden_grad", "logits_grad"),
    "weight_grad": ("grad", "weight_grad", "bias_grad"),
    "weight": ("weight",),
}
MODES = ("scale", "element", "shard")
MAX_EPS = {"scale": 2.0, "element": 2.0, "shard": 2.0}


def record_keys(obs, observable: str) -> list:
    """The keys of ``obs.tensors`` this observable covers, in recording order; initial weights
    (step -1) are left out: they are the reference's own values, checked bitwise."""
    kinds = OBSERVABLES[observable]
    return [k for k in obs.tensors if k[0] in kinds and k[1] >= 0 and obs.tensors[k].size]


def median_element(array: np.ndarray) -> tuple:
    """Index of the nonzero element of median magnitude (any element when all are zero)."""
    flat = np.abs(array).ravel()
    nonzero = np.flatnonzero(flat)
    pool = nonzero if nonzero.size else np.arange(flat.size)
    order = pool[np.argsort(flat[pool], kind="stable")]
    return np.unravel_index(int(order[len(order) // 2]), array.shape)


def shard_block(array: np.ndarray, sharded: bool, tp: int, tp_rank: int):
    """The index of one TP shard's block: all of a record the rank holds a shard of, else the
    partition formula's block of the last dimension."""
    if sharded or array.ndim == 0 or tp <= 1:
        return (Ellipsis,)
    return (Ellipsis, shard_slice(array.shape[-1], tp, tp_rank))


def perturb(observations: dict, rank: int, observable: str, mode: str, eps: float, claims, tp: int) -> dict:
    """A copy of ``observations`` (rank -> RankObservations) with one rank's observable perturbed.
    Returns the input unchanged in content for ranks other than ``rank``."""
    if mode not in MODES:
        raise ValueError(f"perturbation mode must be one of {MODES}, got {mode!r}")
    out = dict(observations)
    obs = copy.copy(observations[rank])
    obs.tensors = dict(obs.tensors)
    keys = record_keys(obs, observable)
    if mode == "element":
        keys = keys[:1]
    for key in keys:
        array = obs.tensors[key].copy()
        if mode == "scale":
            array *= 1 + eps
        elif mode == "element":
            array[median_element(array)] *= 1 - eps
        else:
            kind, name = key[0], key[3]
            dim = claims.micro_records.get(kind) if kind in claims.micro_records else claims.param_shards.get(name)
            array[shard_block(array, dim is not None, tp, obs.tp_rank)] *= 1 - eps
        obs.tensors[key] = array
    out[rank] = obs
    return out


def available(observations: dict, rank: int, observable: str) -> bool:
    return bool(record_keys(observations[rank], observable))
