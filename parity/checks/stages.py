"""Stage-local oracles: one stage of a training step redone by the reference's code, at the case dtype and in
float64, on the subject's own recorded inputs to it, so no upstream rounding is inherited. Why, and each
stage's arithmetic: docs/tolerances.md#stage-local-oracles."""
from __future__ import annotations

import numpy as np
import torch

from parity.checks.bounded_cache import BoundedCache
from parity.checks.rounding import RoundingNoise
from references.loss import causal_lm_loss, continued_shift_labels
from references.seeding import exact_inputs
from references.trajectory import trainer_objective


# Recent stage references, keyed by their inputs' bytes (docs/tolerances.md#stage-local-oracles).
_CACHE_SIZE = 64
_CACHE = BoundedCache(lambda: _CACHE_SIZE)  # locked: parity run -j judges cases in threads


def losses_and_head_input_grads(logits: list, labels: list, weights: list | None, num_items: list, spec,
                                train, dtype: torch.dtype):
    """Per micro-batch (logits[i] [B, T, V], labels[i] [B, T], num_items[i]): the loss, the logits gradient [B*T, V]
    and, with ``weights`` ([V, H] each), the head-input gradient [B*T, H], in ``dtype`` the reference's way (float64:
    the oracle), one autograd graph for all (docs/tolerances.md#stage-local-oracles)."""
    key = (b"".join(a.tobytes() for a in logits), logits[0].shape, len(logits),
           b"".join(t.numpy().tobytes() for t in labels),
           None if weights is None else b"".join(w.tobytes() for w in weights), tuple(num_items), spec,
           train, dtype)
    result = _CACHE.get(key)
    if result is None:
        result = _compute(logits, labels, weights, num_items, spec, train, dtype)
        _CACHE.put(key, result)
    return result


def _compute(logits, labels, weights, num_items, spec, train, dtype):
    with exact_inputs():  # the subject's own values: their cast to the dtype they hold is exact
        z = torch.from_numpy(np.stack(logits)).to(dtype).requires_grad_(True)
        w = None if weights is None else torch.from_numpy(np.stack(weights)).to(dtype)
    losses = [causal_lm_loss(z[i], labels[i], reduction=spec.reduction, ignore_index=spec.ignore_index,
                             num_items_in_batch=num_items[i] if spec.reduction == "num_items" else None,
                             **({"shift_labels": continued_shift_labels(labels[i])}
                                if spec.labels_form == "shift_labels" else {}))
              for i in range(len(logits))]
    sum(trainer_objective(loss, train, spec.reduction) for loss in losses).backward()
    dz = z.grad.reshape(len(logits), -1, z.shape[-1])
    grads = [None] * len(logits)
    if w is not None:
        grads = list(torch.bmm(dz, w).detach().double().numpy())
    return [loss.detach().double().numpy() for loss in losses], grads, list(dz.detach())


def partial_products_magnitude(dz: torch.Tensor, weight: np.ndarray, parts: list) -> np.ndarray:
    """sum over the vocabulary shards ``parts`` of |dz[:, part] @ weight[part]| in float64 (dz [N, V], weight
    [V, H]): the partial products' magnitudes (docs/tolerances.md#a-sharded-heads-partial-products)."""
    dz, w = dz.double(), torch.from_numpy(weight).double()
    return sum((dz[:, part] @ w[part]).abs() for part in parts).numpy()


def lookup_loss_from_lookup(out: np.ndarray, target: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """The lookup-loss stage: references.embedding_lookup.lookup_loss of the recorded lookup held in
    ``dtype`` (the case dtype: the loss then computes in float32, as the reference's; float64: the oracle)."""
    from references.embedding_lookup import lookup_loss

    with exact_inputs():
        out = torch.from_numpy(out).to(dtype)
    return lookup_loss(out, target).double().numpy()


def logits_from_head_input(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, dtype: torch.dtype):
    """The logits stage: F.linear of the recorded head input with the head's weight and bias, in
    ``dtype`` (float64: the oracle), as float64 numpy of x's leading shape + [V]."""
    with exact_inputs():
        x, weight = torch.from_numpy(x).to(dtype), torch.from_numpy(weight).to(dtype)
        bias = None if bias is None else torch.from_numpy(bias).to(dtype)
    return torch.nn.functional.linear(x, weight, bias).double().numpy()


def head_param_grads(dzs: list, xs: list, dtype: torch.dtype, with_bias: bool):
    """One step's head weight [V, H] (and bias [V]) gradient: dz^T x per micro-batch (dzs[i] [N, V], xs[i] numpy
    [..., H]) in ``dtype``, accumulated in ``dtype`` as autograd's p.grad."""
    weight = bias = None
    for dz, x in zip(dzs, xs):
        dz = dz.to(dtype)
        with exact_inputs():
            x = torch.from_numpy(x).to(dtype).reshape(dz.shape[0], -1)
        gw = dz.t() @ x
        weight = gw if weight is None else weight + gw
        if with_bias:
            gb = dz.sum(dim=0)
            bias = gb if bias is None else bias + gb
    return weight.double().numpy(), None if bias is None else bias.double().numpy()


def shared_rounding_weights(logits: np.ndarray, dz64: torch.Tensor, u: float) -> np.ndarray:
    """[N, V]: p_tv s_t e_t, each logits-gradient entry's share of its token's row-shared log-sum-exp rounding,
    from the stage's logits and float64 dz64 = (p - onehot) s_t (docs/tolerances.md#a-rows-shared-rounding)."""
    from parity.checks.tolerances import lse_shared_error

    z = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    row_max = z.max(axis=-1, keepdims=True)
    lse = row_max + np.log(np.exp(z - row_max).sum(axis=-1, keepdims=True))
    p = np.exp(z - lse)
    dz = dz64.double().numpy().reshape(p.shape)
    # dz / p is s_t at every entry but the target's ((p - 1) s_t / p there, below it): the row's max is s_t.
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.nan_to_num(np.where(p > 0, dz / p, 0.0)).max(axis=-1, keepdims=True)
    return np.abs(p * scale) * lse_shared_error(row_max, lse, u)


def head_grad_shared_rms(weights: list, xs: list, with_bias: bool):
    """A step's per-entry bound of the head weight (and bias) gradient's row-shared rounding error: the tokens'
    shares combined in quadrature, sqrt(sum_t (w_tv x_th)^2)."""
    weight = bias = 0.0
    for w, x in zip(weights, xs):
        x = x.astype(np.float64).reshape(w.shape[0], -1)
        weight = weight + np.square(w).T @ np.square(x)
        if with_bias:
            bias = bias + np.square(w).sum(axis=0)
    return np.sqrt(weight), np.sqrt(bias) if with_bias else None


def sampled_logits_grads(logits, labels, num_items, spec, train, dtype: torch.dtype, seed: int) -> list:
    """One rounding sample (``seed``) of the CE stage's logits gradients, for the head-gradient stage's bound;
    never cached, so a perturbed result cannot stand in for the stage reference."""
    with RoundingNoise(seed):
        return _compute(logits, labels, None, num_items, spec, train, dtype)[2]


def sampled_head_param_grads(dzs: list, xs: list, dtype: torch.dtype, with_bias: bool, seed: int):
    """head_param_grads with every rounding moved by up to a unit (sample ``seed``)."""
    with RoundingNoise(seed):
        return head_param_grads(dzs, xs, dtype, with_bias)
