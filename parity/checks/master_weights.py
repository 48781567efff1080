"""A low-precision case's float32 master weights, after every update, against the reference's SGD master: a
master that loses precision is invisible in the bf16/fp16 weights (docs/tolerances.md#master-weights)."""
from __future__ import annotations

import numpy as np

from parity.checks.tolerances import master_weight_bound, master_weight_sampled_bound
from parity.observe.records import record_kind


def master_weight_checks(comparison) -> list[dict]:
    """Check dicts (name, passed, step, rank, measured, bound, detail) for compare.Comparison.add."""
    if not comparison.subject.records_master_weights(comparison.values):
        return []
    ref_traj, oracle = comparison.reference, comparison.oracle
    exact = record_kind("master_weight").oracle  # the oracle's kind a master is held against
    floor = comparison.floor_dtype("master_weight")  # the precision of what a master moved by
    out = []
    for step in range(comparison.train.steps):
        names = [k[4] for k in ref_traj.records if k[0] == "master_weight" and k[1] == step]
        for rank, o in sorted(comparison.obs.items()):
            for name in names:
                ref = comparison._record_view(ref_traj, "master_weight", step, name, rank)
                orc = comparison._record_view(oracle, exact, step, name, rank)
                start = comparison._record_view(oracle, exact, -1, name, rank)
                got = o.get("master_weight", step, None, name)
                where = {"name": f"master_weight[{name}]", "step": step, "rank": rank}
                if got is None and orc.size == 0:
                    # An empty shard has no float32 master to hand out (DeepSpeed keeps none): vacuous, as the
                    # other checks treat empty arrays (docs/tolerances.md#master-weights).
                    out.append({**where, "passed": True, "detail": "empty shard: no master to hold"})
                    continue
                if got is None or got.shape != orc.shape:
                    out.append({**where, "passed": False, "detail": "not observed" if got is None else
                                f"shape {got.shape} != expected {orc.shape}"})
                    continue
                measured = float(np.max(np.abs(got - orc))) if got.size else 0.0
                movement = float(np.max(np.abs(orc - start))) if orc.size else 0.0
                bound = master_weight_bound(floor, float(np.max(np.abs(ref - orc))) if ref.size else 0.0,
                                            float(np.max(np.abs(orc))) if orc.size else 0.0, movement)
                detail = ""
                if measured > bound.value:  # the samples can only widen a bound: taken on a miss alone
                    sampled = comparison.sampled_error(
                        "master_weight", step, None, None, name,
                        lambda a, name=name, rank=rank: comparison._param_view(name, a, rank))()
                    if sampled is not None and sampled.shape[1:] == got.shape and sampled.size:
                        wider = master_weight_sampled_bound(floor, bound, float(np.max(sampled)), movement)
                        if wider is not None:
                            bound, detail = wider, "sampled max"
                finite = bool(np.all(np.isfinite(got)))
                out.append({**where, "passed": finite and measured <= bound.value, "measured": measured,
                            "bound": bound.value, "detail": detail if finite else "non-finite values"})
    return out
