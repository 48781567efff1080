"""Stage oracles after the backward: each optimizer-side stage redone in float64 from what the rank itself held at
its start (records.OPTIMIZER_STAGE_RECORDS, parity/subjects/engine_stages.py), held to that one stage's rounding
(tolerances.py, docs/tolerances.md#optimizer-stages):

- grad_accum[stage]: the accumulated gradient (as the data-parallel reduction receives it; without a recorded
  reduction, the step gradient of one replica) against the float64 sum of the rank's own micro-batch gradients, in
  the accumulation dtype the configuration asks for;
- dp_reduce[stage]: the reduced gradient against the float64 mean of every data-parallel peer's reduce input,
  in the communication dtype the engine used;
- grad_norm[stage]: the clipping norm the engine reports against the float64 norm of the gradients the ranks held;
- unscale_clip[stage]: the gradient the optimizer's step applied against the held (unscaled) gradient times the
  float64 clipping coefficient (exactly the held gradient without clipping: the loss scale is a power of two);
- opt_step[stage]: the weight the step wrote (the float32 master where one is kept) against start - lr g;
- copy_back[stage]: the low-precision weight against its float32 master rounded to nearest, bitwise.
"""
from __future__ import annotations

import numpy as np
import torch

from parity.checks.tolerances import (accumulation_bound, clip_stage_bound, norm_stage_bound, reduction_bound,
                                      step_stage_bound)
from parity.observe.dtypes import DTYPES


def accumulation_dtype(values) -> str:
    """The dtype the configuration accumulates micro-batch gradients in: an fp32 model, or data_types.grad_accum_dtype
    fp32 without bf16_master_weights_and_grads (bf16 gradients), float32; else the model dtype (autograd's p.grad)."""
    if values["dtype"] == "fp32" or (values.optional("grad_accum", "model") == "fp32"
                                     and not values.optional("bf16_master", False)):
        return "fp32"
    return values["dtype"]


def _held(name, got, want, bound, **where) -> dict:
    """One check dict: every entry of ``got`` within ``bound`` (per entry) of the float64 ``want``; the worst entry's
    error and bound reported."""
    if got is None or got.shape != want.shape:
        return {"name": name, "passed": False, **where,
                "detail": "not observed" if got is None else f"shape {got.shape} != expected {want.shape}"}
    if got.size == 0:
        return {"name": name, "passed": True, **where, "detail": "empty shard"}
    # Where the stage's input had already overflowed (an fp16 step that is then skipped), IEEE arithmetic carries
    # the inf or nan on, and the stage must too: such entries are held to that value, the others to the bound.
    numbers = np.isfinite(want) & np.isfinite(got)
    carried = ~np.isfinite(want) & ((got == want) | (np.isnan(got) & np.isnan(want)))
    finite = bool(np.all(numbers | carried))
    bound = np.broadcast_to(bound, want.shape)
    err = np.where(numbers, np.abs(np.where(numbers, got, 0.0) - np.where(numbers, want, 0.0)), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        worst = int(np.argmax(np.where(bound > 0, err / bound, np.where(err > 0, np.inf, 0.0))))
    within = np.where(numbers, err <= bound, True)
    return {"name": name, "passed": finite and bool(np.all(within)), "measured": float(err.flat[worst]),
            "bound": float(bound.flat[worst]), **where,
            "detail": "" if finite else "non-finite values where the stage's input was finite, or not carried on"}


def _reduced_one_replica(micros: list, reduce_dtype: str | None, scale: float) -> list:
    """The micro-batch gradients as a DP-1 reduction hands them to accumulation (ZeRO 2 reduces each before adding
    it): cast into the reduction dtype and back, on the loss-scaled values the rank held (1/1 is exact). Without a
    per-micro reduction (``reduce_dtype`` None), as they are."""
    if reduce_dtype is None or any(m is None for m in micros):
        return micros
    return [torch.from_numpy(m * scale).float().to(getattr(torch, reduce_dtype)).double().numpy() / scale
            for m in micros]


def optimizer_stage_checks(c) -> list[dict]:
    """Check dicts for compare.Comparison.add; none for a subject that records no optimizer-side stage."""
    if not any(o.facts.get("stage_records") for o in c.obs.values()):
        return []
    out, train, values = [], c.train, c.values
    one_replica = {o.dp_rank for o in c.obs.values()} == {0}
    accum = accumulation_dtype(values)
    # The clip the engine applies: the case's, or DeepSpeed's default where the config leaves gradient_clipping out
    # (clip_key unset: a convention-difference finding the end-to-end checks mark; rank_decisions holds the value
    # to the formula). The stage is judged on the arithmetic of the clip it was configured with.
    clip = train.clip or max((o.facts.get("rank_decisions", {}).get("gradient_clipping") or 0.0
                              for o in c.obs.values()), default=0.0)
    for step in range(train.steps):
        if step in c.reference_skipped():
            continue  # check_skipped_step holds the weights there
        names = [k[4] for k in c.reference.records if k[0] == "grad" and k[1] == step]
        held = c.observed_grad_norm(step, names) if clip > 0 else None
        for rank, o in sorted(c.obs.items()):
            where = {"step": step, "rank": rank}
            # The clipping stage starts from the held gradients and the norm the rank reports (checked here against
            # theirs); without a reported norm, from theirs, as float32 would have summed them.
            reported = o.get("grad_norm", step, None, None) if held is not None and c.claims.reports_grad_norm else None
            if reported is not None:
                out.append(_held("grad_norm[stage]", np.asarray(reported, np.float64), np.asarray(held[0]),
                                 np.asarray(norm_stage_bound(held[0], held[1])), **where))
            norm, norm_error = ((float(reported), 0.0) if reported is not None else
                                (held[0], norm_stage_bound(1.0, held[1])) if held is not None else (None, 0.0))
            coefficient = 1.0 if norm is None else min(1.0, clip / (norm + 1e-6))
            for name in names:
                grad = o.get("grad", step, None, name)
                micros = [o.get_stage("micro_grad", step, m, name) for m in range(train.micro_batches)]
                accumulated = o.get_stage("reduce_in", step, None, name)
                if accumulated is None and one_replica:
                    accumulated = grad
                    micros = _reduced_one_replica(micros, o.facts.get("micro_reduce_dtypes", {}).get(name),
                                                  o.facts.get("stage_scales", {}).get(step, 1.0))
                if accumulated is not None and all(m is not None and m.shape == accumulated.shape for m in micros):
                    out.append(_held(f"grad_accum[{name}][stage]", accumulated, np.sum(micros, axis=0),
                                     accumulation_bound(micros, accum), **where))
                peers = [p.get_stage("reduce_in", step, None, name) for p in c.obs.values() if p.tp_rank == o.tp_rank]
                reduced = o.get_stage("reduce_out", step, None, name)
                if reduced is not None and all(p is not None and p.shape == reduced.shape for p in peers):
                    grad_dtype = o.facts["stage_records"][("reduce_out", step, None, name)][1]
                    out.append(_held(f"dp_reduce[{name}][stage]", reduced, np.mean(peers, axis=0),
                                     reduction_bound(peers, o.facts["comm_dtype"], grad_dtype), **where))
                applied, start = o.get_stage("opt_grad", step, None, name), o.get_stage("opt_start", step, None, name)
                if applied is not None and grad is not None:
                    check = _held(f"unscale_clip[{name}][stage]", applied, grad * coefficient,
                                  clip_stage_bound(grad, coefficient, norm_error, norm is not None,
                                                   o.facts["stage_records"][("opt_grad", step, None, name)][1],
                                                   o.dtypes.get(("grad", step, None, name))), **where)
                    if not check["passed"] and applied.shape == grad.shape:
                        with np.errstate(divide="ignore", invalid="ignore"):
                            seen = np.nanmedian(np.where(grad != 0, applied / grad, np.nan))
                        check["detail"] = f"coefficient {coefficient:.9g}, the applied gradient's {seen:.9g}"
                    out.append(check)
                master = o.get("master_weight", step, None, name)
                weight = o.get("weight", step, None, name)
                step_dtype = None if start is None else o.facts["stage_records"][("opt_start", step, None, name)][1]
                # The step's output: the master it updated, else the weight where the step ran in the weight's dtype
                # (a float32 master the subject does not record is not the bf16 weight: copy_back's, unjudged).
                new = master if master is not None else (
                    weight if o.dtypes.get(("weight", step, None, name)) == step_dtype else None)
                if applied is not None and start is not None and new is not None:
                    update = train.lr * applied
                    out.append(_held(f"opt_step[{name}][stage]", new, start - update,
                                     step_stage_bound(start - update, update, step_dtype), **where))
                if master is not None and weight is not None and master.shape == weight.shape:
                    rounded = torch.from_numpy(master).float().to(DTYPES[c.dtype]).double().numpy()
                    out.append(_held(f"copy_back[{name}][stage]", weight, rounded, np.zeros(()), **where))
    return out
