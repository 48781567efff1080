"""`parity diff A B`: what changed between two report directories (`parity run --report DIR`).

Read from each DIR/summary.json (one entry per case: verdict, worst measured/bound ratio, findings). Lists
cases whose verdict changed, cases in one run only, cases whose worst ratio moved by at least
--ratio-change (absolute, in units of the bound; default parity.checks.tolerances.RATIO_CHANGE), and the
known-divergence findings fixed or newly present. Exits 1
when a verdict got worse (below), so it can gate CI; 2 on bad input.

Worse means a higher rank in VERDICT_RANK: passed/xpassed < skipped/diverged < failed; a case
that failed in B and is not in A at all is worse too. A case that disappeared is listed, not gating.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from parity.checks.tolerances import RATIO_CHANGE
from parity.checks.verdict import DIVERGED, FAILED, FIXED, PASSED, PRESENT, SKIPPED, XPASSED
from parity.report.environment import version_changes

# A skip lost a check that ran before; a divergence is a documented difference; xpassed matched.
VERDICT_RANK = {PASSED: 0, XPASSED: 0, SKIPPED: 1, DIVERGED: 1, FAILED: 2}
REQUIRED = "summary.json"


class DiffInputError(ValueError):
    pass


def load_run(directory) -> dict:
    """summary.json of a report directory, or an error naming what is missing or malformed."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DiffInputError(f"{directory}: not a directory (expected a report directory written by "
                             f"`parity run --report DIR`)")
    path = directory / REQUIRED
    if not path.is_file():
        raise DiffInputError(f"{directory}: not a report directory: {REQUIRED} is missing "
                             f"(write one with `parity run --report {directory}`)")
    try:
        data = json.loads(path.read_text())
        cases = data["cases"]
        for c in cases:
            c["id"], c["verdict"]  # noqa: B018 - the two fields a diff cannot do without
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DiffInputError(f"{path}: not a parity summary ({type(exc).__name__}: {exc}); expected "
                             f"{{'cases': [{{'id': ..., 'verdict': ...}}, ...]}}") from exc
    unknown = {c["verdict"] for c in cases} - set(VERDICT_RANK)
    if unknown:
        raise DiffInputError(f"{path}: unknown verdict {sorted(unknown)[0]!r} (allowed: {', '.join(VERDICT_RANK)})")
    return data


def case_key(case: dict, ignore_axes: tuple) -> tuple | str:
    """The id, or with ignore_axes (e.g. device, to set a CPU run against a GPU run) the subject
    and every other axis value."""
    if not ignore_axes:
        return case["id"]
    axes = case.get("axes") or {}
    return (case.get("subject"), tuple(sorted((k, str(v)) for k, v in axes.items() if k not in ignore_axes)),
            json.dumps(case.get("expect"), sort_keys=True))


def _index(data: dict, ignore_axes: tuple, label: str) -> dict:
    index = {}
    for c in data["cases"]:
        key = case_key(c, ignore_axes)
        if key in index:
            raise DiffInputError(f"run {label}: cases {index[key]['id']!r} and {c['id']!r} are the same case once "
                                 f"{', '.join(ignore_axes)} is ignored; ignore fewer axes")
        index[key] = c
    return index


def _ratio_delta(a, b) -> float | None:
    if a is None or b is None:
        return None
    if math.isinf(a) and math.isinf(b):
        return 0.0
    return b - a


def diff_runs(a: dict, b: dict, ratio_change: float = RATIO_CHANGE, ignore_axes: tuple = ()) -> dict:
    if not ratio_change > 0:
        raise DiffInputError(f"--ratio-change must be a positive number, got {ratio_change}")
    ia, ib = _index(a, ignore_axes, "A"), _index(b, ignore_axes, "B")
    changed, margins = [], []
    for key in [k for k in ia if k in ib]:
        ca, cb = ia[key], ib[key]
        if ca["verdict"] != cb["verdict"]:
            changed.append({"case": cb["id"], "a": ca["verdict"], "b": cb["verdict"],
                            "worse": VERDICT_RANK[cb["verdict"]] > VERDICT_RANK[ca["verdict"]],
                            "b_first_failure": cb.get("first_failure") or cb.get("reason")})
        delta = _ratio_delta(ca.get("worst_ratio"), cb.get("worst_ratio"))
        if delta is not None and abs(delta) >= ratio_change:
            margins.append({"case": cb["id"], "a_ratio": ca["worst_ratio"], "b_ratio": cb["worst_ratio"],
                            "delta": delta, "b_check": (cb.get("worst_check") or {}).get("name")})
    only_a = [{"case": ia[k]["id"], "verdict": ia[k]["verdict"]} for k in ia if k not in ib]
    only_b = [{"case": ib[k]["id"], "verdict": ib[k]["verdict"], "worse": ib[k]["verdict"] == FAILED}
              for k in ib if k not in ia]
    margins.sort(key=lambda m: -abs(m["delta"]))
    worse = sum(c["worse"] for c in changed) + sum(c["worse"] for c in only_b)
    fixed, present = findings_changed(ia, ib)
    return {"ratio_change": ratio_change, "ignore_axes": list(ignore_axes), "compared": len(set(ia) & set(ib)),
            "versions_changed": version_changes(a, b),
            "verdict_changed": changed, "only_in_a": only_a, "only_in_b": only_b, "ratio_changed": margins,
            "findings_fixed": fixed, "findings_newly_present": present, "worse": worse}


def findings_changed(ia: dict, ib: dict) -> tuple[list, list]:
    """Per finding (a known divergence's mark), the cases in both runs where it was present in A and is fixed in B,
    and those where it is present in B and was not in A."""
    fixed, present = {}, {}
    for key in [k for k in ia if k in ib]:
        fa, fb = ia[key].get("findings") or {}, ib[key].get("findings") or {}
        for name in dict.fromkeys([*fa, *fb]):
            if fa.get(name) == PRESENT and fb.get(name) == FIXED:
                fixed.setdefault(name, []).append(ib[key]["id"])
            elif fb.get(name) == PRESENT and fa.get(name) != PRESENT:
                present.setdefault(name, []).append(ib[key]["id"])
    as_rows = lambda found: [{"finding": n, "cases": ids} for n, ids in sorted(found.items())]  # noqa: E731
    return as_rows(fixed), as_rows(present)


def _table(header, rows) -> list[str]:
    rows = [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return ["  " + fmt(header), "  " + "-" * len(fmt(header)), *("  " + fmt(r) for r in rows)]


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_diff(result: dict, a_label: str, b_label: str) -> str:
    lines = [f"A = {a_label}", f"B = {b_label}", f"{result['compared']} cases in both"
             + (f" (matched ignoring {', '.join(result['ignore_axes'])})" if result["ignore_axes"] else "")]
    if result["versions_changed"]:
        # Said first: a verdict that changed with DeepSpeed is the point of the run, not noise.
        lines += ["", f"tested different versions ({len(result['versions_changed'])}):"]
        lines += [f"  {line}" for line in result["versions_changed"]]
    if result["verdict_changed"]:
        lines += ["", f"verdict changed ({len(result['verdict_changed'])}):"]
        lines += _table(("case", "A", "B", "", "B's first failure / reason"),
                        [(c["case"], c["a"], c["b"], "WORSE" if c["worse"] else "", (c["b_first_failure"] or "")[:120])
                         for c in result["verdict_changed"]])
    for key, label in (("only_in_a", "only in A"), ("only_in_b", "only in B")):
        if result[key]:
            lines += ["", f"{label} ({len(result[key])}):"]
            lines += _table(("case", "verdict", ""), [(c["case"], c["verdict"], "WORSE" if c.get("worse") else "")
                                                      for c in result[key]])
    if result["ratio_changed"]:
        lines += ["", f"worst measured/bound moved by >= {result['ratio_change']:g} ({len(result['ratio_changed'])}):"]
        lines += _table(("case", "A", "B", "change", "B's worst check"),
                        [(m["case"], _ratio(m["a_ratio"]), _ratio(m["b_ratio"]), f"{m['delta']:+.3f}",
                          m["b_check"] or "-") for m in result["ratio_changed"]])
    for key, label in (("findings_fixed", "findings fixed (present in A, their checks pass in B)"),
                       ("findings_newly_present", "findings newly present (present in B, not in A)")):
        if result.get(key):
            lines += ["", f"{label} ({len(result[key])}):"]
            lines += _table(("finding", "cases", "first case"),
                            [(f["finding"], len(f["cases"]), f["cases"][0]) for f in result[key]])
    if not (result["verdict_changed"] or result["only_in_a"] or result["only_in_b"] or result["ratio_changed"]
            or result.get("findings_fixed") or result.get("findings_newly_present")):
        lines += ["", f"no differences (verdicts equal, worst ratios within {result['ratio_change']:g})"]
    lines += ["", f"{result['worse']} got worse" if result["worse"] else "nothing got worse"]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("a", metavar="A", help="report directory (parity run --report A): the baseline")
    parser.add_argument("b", metavar="B", help="report directory to compare with A")
    parser.add_argument("--ratio-change", type=float, default=RATIO_CHANGE, metavar="X",
                        help=f"list cases whose worst measured/bound ratio moved by at least X, absolute "
                             f"(default {RATIO_CHANGE:g}: a tenth of the bound)")
    parser.add_argument("--ignore-axis", action="append", default=[], metavar="AXIS",
                        help="match cases by subject and axes without AXIS (repeatable; e.g. device for CPU vs GPU)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def cmd_diff(args) -> int:
    import sys

    try:
        result = diff_runs(load_run(args.a), load_run(args.b), args.ratio_change, tuple(args.ignore_axis))
    except DiffInputError as exc:
        print(f"parity diff: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else format_diff(result, args.a, args.b))
    return 1 if result["worse"] else 0
