"""Which subject was run at which axis values, and how many cases: the coverage table of docs/subjects.md.

Generated from the case files (never written by hand), and a self-test keeps that page's copy
current (tests/matrix/test_coverage.py).
"""
from __future__ import annotations

from collections import Counter, defaultdict

from parity.axes import AXES

BEGIN, END = "<!-- coverage:begin -->", "<!-- coverage:end -->"
# Axes shown as columns; the rest are summarised under "other".
COLUMNS = ("device", "dtype", "reduction", "vocab", "hidden", "tp", "dp", "zero")


def _fmt(axis: str, values) -> str:
    label = {True: "yes", False: "no"}
    ordered = sorted(values, key=lambda v: (str(type(v)), v))
    return " ".join(label.get(v, str(v)) if isinstance(v, bool) else str(v) for v in ordered)


def coverage_table(cases) -> str:
    by_subject = defaultdict(list)
    for c in cases:
        by_subject[c.subject].append(c)
    header = ["subject", "cases", "parity", "rejections", "known div."] + list(COLUMNS) + ["other axes"]
    rows = []
    for subject, group in sorted(by_subject.items()):
        kinds = Counter("rejection" if c.expect.is_error else "divergence" if c.divergence else "parity"
                        for c in group)
        seen = defaultdict(set)
        for c in group:
            for axis, value in c.axes:
                seen[axis].add(value)
        cells = [_fmt(a, seen[a]) if a in seen else "-" for a in COLUMNS]
        other = "; ".join(f"{a}: {_fmt(a, v)}" for a, v in seen.items()
                          if a not in COLUMNS and (len(v) > 1 or next(iter(v)) != AXES[a].default))
        rows.append([subject, str(len(group)), str(kinds["parity"]), str(kinds["rejection"]),
                     str(kinds["divergence"])] + cells + [other or "-"])
    total = ["**total**", str(len(cases))] + [str(sum(int(r[i]) for r in rows)) for i in (2, 3, 4)]
    rows.append(total + [""] * (len(header) - len(total)))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def page_block(cases) -> str:
    return f"{BEGIN}\n{coverage_table(cases)}\n{END}"
