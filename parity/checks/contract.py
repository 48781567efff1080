"""Precision and placement: one ``contract[<kind>]`` check per rank and record kind holds every tensor to the
dtype the unsharded reference holds there and to the rank's device
(docs/tolerances.md#the-dtype-and-device-contract)."""
from __future__ import annotations

from parity.observe.records import MICRO, record_kind


def _reference_key(kind, step, micro, name, dp_rank):
    # Per-micro-batch records (the schema's ``per``) are the reference's at this data-parallel rank; the
    # rest (weights, gradients, the norm) are the one unsharded tensor every rank holds a view of.
    if record_kind(kind).per == MICRO or micro is not None:
        return (kind, step, micro, dp_rank, None)
    return (kind, step, None, None, name)


def contract_checks(observations: dict, reference) -> list[dict]:
    """One dict per rank and record kind: name, passed, rank, detail (compare.py makes Checks of them)."""
    layouts = getattr(reference, "layouts", {})
    checks = []
    for rank, o in sorted(observations.items()):
        want_device = o.facts.get("rank_device")
        by_kind: dict = {}
        for key in sorted(o.tensors, key=repr):
            kind, step, micro, name = key
            where = f"{kind}[{name}]" if name else kind
            problems = by_kind.setdefault(kind, [])
            ref = layouts.get(_reference_key(kind, step, micro, name, o.dp_rank))
            if ref is None:
                problems.append(f"{where} step {step} micro {micro}: the reference holds no tensor here")
                continue
            got_dtype, got_device = o.dtypes.get(key), getattr(o, "devices", {}).get(key)
            # An empty shard holds no value a dtype could change; its placement still counts
            # (docs/tolerances.md#the-dtype-and-device-contract).
            empty = getattr(o.tensors.get(key), "size", 1) == 0
            if got_dtype != ref[0] and not empty:
                problems.append(f"{where} step {step} micro {micro}: dtype {got_dtype}, reference {ref[0]}")
            if want_device is not None and got_device != want_device:
                problems.append(f"{where} step {step} micro {micro}: on {got_device}, rank runs on {want_device}")
        for kind, problems in by_kind.items():
            detail = ("dtype and device as the reference's" if not problems else
                      f"{len(problems)} mismatches; first: {problems[0]}")
            checks.append({"name": f"contract[{kind}]", "passed": not problems, "rank": rank, "detail": detail})
    return checks
