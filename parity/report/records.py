"""What the reports read from verdict dicts (Verdict.as_dict()): plain data in, plain data out.

The writers (summary.md, report.html, results.jsonl) and `parity diff` work from these dicts, never
from live Verdict/Check objects, so verdicts gathered elsewhere (pytest-xdist workers) report alike.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import fields

from parity.checks.compare import Check
from parity.checks.tolerances import NEAR_FAILING_RATIO
from parity.checks.verdict import FAILED, PASSED, STATUSES, XPASSED

SHORTENED = ("rank", "micro", "measured", "bound", "margin", "ratio")  # result_lines: to six significant digits
RESULT_FIELDS = ("case", "subject", "verdict", "check", "step", "checks", "passed", "rank", "micro", "measured",
                 "bound", "margin", "ratio", "detail")


def check_results(record: dict) -> list[dict]:
    return record.get("check_results") or []


def result_lines(record: dict) -> list[dict]:
    """results.jsonl rows of one case: one per tensor (check name) and step, where the ranks' and
    micro-batches' checks of that tensor are folded into their worst one (the rank and micro it was
    on, its measured error, bound, margin and ratio; `checks` says how many were folded, `passed`
    whether all of them passed). Per check, a full run would be ~150 MB; report.html keeps every
    check of the cases it plots. A case without checks (a rank error, a harness error, a skip)
    still gets one row, with its verdict and reason."""
    head = {"case": record["id"], "subject": record["subject"], "verdict": record["verdict"]}
    checks = check_results(record)
    if not checks:
        return [{**head, "check": None, "reason": record.get("reason") or record.get("first_failure")
                 or "no checks recorded"}]
    # The default matrix has about 700k checks: one plain loop per check and per row, no helper
    # calls, is what keeps results.jsonl from being most of the report's writing.
    groups: dict = {}
    for c in checks:  # dicts keep insertion order: setup checks first, then step by step
        key = (c["name"], c.get("step"))
        group = groups.get(key)
        if group is None:
            groups[key] = [c]
        else:
            group.append(c)
    rows = []
    isfinite = math.isfinite
    for (name, step), group in groups.items():
        failing = [c for c in group if not c["passed"]]
        pool = failing or group
        worst = None
        for c in pool:  # max() by ratio over those with one: the first of equals, as max() keeps
            ratio = c.get("ratio")
            if ratio is not None and (worst is None or ratio > top):
                worst, top = c, ratio
        if worst is None:
            worst = pool[0]
        row = {**head, "check": name, "step": step, "checks": len(group), "passed": not failing}
        for k in SHORTENED:
            # Six significant digits: a bound is good to two or three; the full repr doubles the file.
            value = worst.get(k)
            row[k] = float(f"{value:.6g}") if isinstance(value, float) and isfinite(value) else value
        # A passing check's detail is often the message it would fail with.
        row["detail"] = (worst.get("detail") or None) if failing else None
        rows.append(row)
    return rows


def first_divergence(record: dict) -> dict | None:
    """The first failed check in the order the checks ran (setup, then step by step)."""
    return next((c for c in check_results(record) if not c["passed"]), None)


def worst_check(record: dict) -> dict | None:
    """The numerical check closest to (or furthest over) its bound."""
    scored = [c for c in check_results(record) if c.get("ratio") is not None and c.get("bound")]
    return max(scored, key=lambda c: c["ratio"]) if scored else None


def worst_ratio(record: dict) -> float | None:
    return record.get("worst_ratio")


def is_near_failing(record: dict) -> bool:
    ratio = worst_ratio(record)
    return record["verdict"] == PASSED and ratio is not None and ratio >= NEAR_FAILING_RATIO


def counts_by_subject(records: list[dict]) -> list[tuple]:
    """Rows (subject, total, *one count per status), sorted by subject, then a 'total' row."""
    by_subject: dict = {}
    for r in records:
        by_subject.setdefault(r["subject"], Counter())[r["verdict"]] += 1
    rows = [(s, sum(c.values()), *(c[st] for st in STATUSES)) for s, c in sorted(by_subject.items())]
    total = Counter(r["verdict"] for r in records)
    rows.append(("total", len(records), *(total[st] for st in STATUSES)))
    return rows


def failed(records: list[dict]) -> list[dict]:
    return [r for r in records if r["verdict"] == FAILED]


def closest(records: list[dict], n: int = 10) -> list[dict]:
    """Passing (and xpassed) cases with a numerical check, closest to their bound first."""
    scored = [r for r in records if r["verdict"] in (PASSED, XPASSED) and worst_ratio(r) is not None]
    return sorted(scored, key=lambda r: -worst_ratio(r))[:n]


def where(check: dict) -> str:
    return " ".join(f"{k}={check[k]}" for k in ("step", "micro", "rank") if check.get(k) is not None)


def fmt(value, spec: str = ".3e") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def failure_summary(record: dict) -> str:
    """One line: the first failed check with its numbers, else the recorded reason."""
    check = first_divergence(record)
    if check is None:
        lines = [ln.strip() for ln in (record.get("first_failure") or record.get("reason") or "").splitlines()
                 if ln.strip()]
        if not lines:
            return "no reason recorded"
        # "harness error:" is followed by a traceback: its last line names the exception.
        return lines[0] + (" " + lines[-1] if lines[0].endswith(":") and len(lines) > 1 else "")
    return Check(**{f.name: check.get(f.name) for f in fields(Check)}).describe()
