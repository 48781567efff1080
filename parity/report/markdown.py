"""summary.md: the run as a person reads it in a pull request, from verdict dicts."""
from __future__ import annotations

from collections import Counter

from parity.report.records import (closest, counts_by_subject, failed, failure_summary, fmt, where,
                                   worst_check, worst_ratio)
from parity.checks.tolerances import NEAR_FAILING_RATIO
from parity.checks.verdict import DIVERGED, SKIPPED, STATUSES, XPASSED


def cell(text) -> str:
    """Table cells: a pipe or a line break would end the cell or the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: tuple, rows: list) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def headline(run: dict) -> str:
    counts = run["counts"]
    parts = [f"{counts[s]} {s}" for s in STATUSES if counts.get(s)]
    return f"{counts['total']} cases: " + (", ".join(parts) or "none run") + f" in {run['wall_seconds']:.1f} s"


def summary_markdown(records: list[dict], run: dict) -> str:
    lines = ["# parity run", "", f"**{headline(run)}**", "", f"`{run['command']}`", "", "## Counts", ""]
    lines += table(("subject", "cases") + STATUSES, counts_by_subject(records))
    bad = failed(records)
    if bad:
        lines += ["", f"## Failed ({len(bad)})", "", "Each reproduces alone with the command shown.", ""]
        for r in bad:
            lines += [f"- **{cell(r['id'])}**: {cell(failure_summary(r))}", f"  `{r['repro']}`"]
    for status, title in ((DIVERGED, "Known divergences"), (XPASSED, "Known divergences that now match (remove "
                                                                      "their marks)"), (SKIPPED, "Skipped")):
        reasons = Counter(r.get("reason") or "" for r in records if r["verdict"] == status)
        if reasons:
            lines += ["", f"## {title} ({sum(reasons.values())})", ""]
            lines += table(("cases", "reason"), [(n, reason) for reason, n in reasons.most_common()])
    not_run = Counter(c["reason"] for c in run.get("not_run", ()))
    if not_run:
        lines += ["", f"## Not run under this launch ({sum(not_run.values())})", ""]
        lines += table(("cases", "reason"), [(n, reason) for reason, n in not_run.most_common()])
    near = closest(records)
    if near:
        lines += ["", "## Closest to their bound", "",
                  f"Passing cases by worst measured/bound ratio; {NEAR_FAILING_RATIO:g} and above counts as "
                  "near-failing in report.html.", ""]
        rows = []
        for r in near:
            w = worst_check(r) or r.get("worst_check") or {}
            rows.append((r["id"], r["verdict"], fmt(worst_ratio(r), ".3f"),
                         f"{w.get('name', '-')} {where(w)}".strip()))
        lines += table(("case", "verdict", "ratio", "check"), rows)
    lines += ["", "## Environment", ""]
    lines += table(("component", "version / value"), sorted(run["environment"].items()))
    modes = Counter(r["mode"] for r in records if r.get("mode"))
    if modes:
        lines += ["", "Ranks ran as: " + "; ".join(f"{m} ({n} cases)" for m, n in sorted(modes.items()))]
    return "\n".join(lines) + "\n"
