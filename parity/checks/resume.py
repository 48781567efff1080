"""Universal-checkpoint resumes: every resumed tensor bitwise the saved shards re-sliced by the suite's formula,
the run after it within the usual bounds (docs/tolerances.md#universal-checkpoint-resumes)."""
from __future__ import annotations

import numpy as np

from parity.observe.partition import shard_slice


def saved_whole(comparison, name: str, state: str):
    """The saved tensor whole: the save layout's TP ranks' pieces (DP replica 0) in TP-rank order."""
    values = comparison.values
    save_tp = values["save_tp"]
    dim = comparison.claims.param_shards.get(name)
    pieces = {}
    for o in comparison.obs.values():
        saved = o.facts.get("checkpointed")
        if saved is None or saved["dp_rank"] != 0:
            continue
        held = saved["state"].get(name, {})
        piece = held.get(state)
        if piece is None and state != "weight" and _zero_element(held.get("weight")):
            # an empty shard: no state kept, none owed (docs/tolerances.md#universal-checkpoint-resumes)
            piece = np.zeros_like(held["weight"])
        pieces[saved["tp_rank"]] = piece
    if sorted(pieces) != list(range(save_tp)) or any(p is None for p in pieces.values()):
        return None
    if dim is None:
        return pieces[0]
    return np.concatenate([pieces[r] for r in range(save_tp)], axis=dim)


def resume_checks(comparison) -> list[dict]:
    values = comparison.values
    if "save_tp" not in values:
        return []
    found = []
    from parity.subjects.deepspeed_universal import SAVED_AFTER, STATES

    names = comparison.initial_names()
    for rank, o in sorted(comparison.obs.items()):
        resumed = o.facts.get("resumed")
        if resumed is None:
            found.append(dict(name="resumed", passed=False, rank=rank, detail="the rank recorded no resumed state"))
            continue
        found.append(dict(name="resumed_global_steps", passed=resumed["global_steps"] == SAVED_AFTER, rank=rank,
                          detail=f"engine.global_steps {resumed['global_steps']} after the load, saved at {SAVED_AFTER}"))
        if values["optimizer"] == "adamw":  # SGD keeps no step count
            steps = resumed.get("optimizer_steps")
            found.append(dict(name="resumed_optimizer_step", passed=steps == [float(SAVED_AFTER)], rank=rank,
                              detail=f"AdamW's step count(s) {steps} after the load, saved at {SAVED_AFTER}"))
        for name in names:
            dim = comparison.claims.param_shards.get(name)
            for state in ("weight",) + STATES[values["optimizer"]]:
                whole = saved_whole(comparison, name, state)
                got = resumed["state"].get(name, {}).get(state)
                check = f"resumed[{name}.{state}]"
                if whole is None:
                    found.append(dict(name=check, passed=False, rank=rank, detail="the saving ranks recorded none"))
                    continue
                want = whole
                if dim is not None:
                    index = [slice(None)] * whole.ndim
                    index[dim] = shard_slice(whole.shape[dim], comparison.tp, o.tp_rank, comparison.grain,
                                             comparison.split)
                    want = whole[tuple(index)]
                if got is None and state != "weight" and want.size == 0:
                    found.append(dict(name=check, passed=True, rank=rank, measured=0.0, bound=0.0,
                                      detail="no state kept for a zero-element shard: nothing to restore"))
                    continue
                found.append(_exact(check, got, want, rank))
    return found


def _zero_element(weight) -> bool:
    return weight is not None and weight.size == 0


def _exact(name, got, want, rank) -> dict:
    if got is None or got.shape != want.shape:
        return dict(name=name, passed=False, rank=rank,
                    detail="not observed" if got is None else f"shape {got.shape} != saved {want.shape}")
    diff = got != want
    detail = "bitwise the saved slice"
    if diff.any():
        first = tuple(int(i) for i in np.argwhere(diff)[0])
        detail = f"{int(diff.sum())} of {diff.size} differ; first at {first}: {got[first]!r} vs saved {want[first]!r}"
    measured = float(np.max(np.abs(got - want))) if got.size else 0.0
    return dict(name=name, passed=not diff.any(), measured=measured, bound=0.0, detail=detail, rank=rank)


def check_trained_on(comparison) -> None:
    """The resumed weights and the run after them against the uninterrupted reference, within its bounds."""
    from parity.subjects.deepspeed_universal import SAVED_AFTER

    if "save_tp" not in comparison.values:
        return
    names = comparison.initial_names()
    for rank, o in sorted(comparison.obs.items()):
        for step in range(SAVED_AFTER - 1, comparison.train.steps):
            for name in names:
                def view(a, name=name, rank=rank):
                    return comparison._param_view(name, a, rank)
                comparison.close_record(f"weight[{name}]", o.get("weight", step, None, name),
                                        ("weight", step, None, None, name), view, step=step, rank=rank)
            if step < SAVED_AFTER:
                continue
            for micro in range(comparison.values["gas"]):
                comparison.close_record("loss", o.get("loss", step, micro, None), ("loss", step, micro, o.dp_rank, None),
                                        step=step, micro=micro, rank=rank)
