"""The quick selection (`parity run --quick`, `pytest -m quick`): a few cases of the default matrix, computed
from the case files, the findings they mark and the mutation check's kill matrix, never picked by hand.

The algorithm, deterministic (ties go to the earlier case in the default matrix's order):
1. killers: for every mutant cell (mutant x family) the kill matrix records as killed, the cheapest case that
   killed it (its seconds in that mutant's run), so the selection kills what the mutation check kills;
2. coverage: every subject, every (subject, axis, value) the case files hold, and every finding a case marks,
   at least once: greedy set cover, most new items per estimated second first;
3. pairs: every pair of axis values within a subject (its axes with more than one value) that some case holds,
   greedily by new pairs per estimated second, while the estimated total stays within BUDGET_S.

A case's estimated seconds (COST MODEL): the median of its subject's warm seconds in the kill matrix's baseline
run (the mutation check's selection, on the 2-core reference VM), else the median over the whole baseline,
times world_size / 2 for cases on more than two ranks (they share the same cores). Written with the reason for
each case by `parity list --quick-update` into cases/quick.txt; tests/matrix/test_quick.py fails when that file
is stale against the case files, the findings or the kill matrix.
"""
from __future__ import annotations

import heapq
import json
import statistics
from itertools import combinations
from pathlib import Path

from parity.matrix.cases import CASES_DIR, load

QUICK_FILE = CASES_DIR / "quick.txt"
KILL_MATRIX = CASES_DIR.parent / "results" / "mutation" / "kill_matrix.json"
# Estimated case-seconds for steps 1-3 together: the ~60 s wall target at -j 2 on the 2-core VM is about two
# case-seconds a wall second. Steps 1 and 2 are taken whatever it costs; only step 3 stops at the budget.
BUDGET_S = 120.0
UPDATE = "parity list --quick-update"


class QuickError(ValueError):
    """The kill matrix or the quick file cannot be used: says which file and why."""


def read_kill_matrix(path: Path = KILL_MATRIX) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise QuickError(f"{path}: cannot read the kill matrix: {exc.strerror or exc} (made by `parity mutants "
                         "--json results/mutation/kill_matrix.json`)") from None
    except json.JSONDecodeError as exc:
        raise QuickError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data.get("mutants"), list) or not isinstance(data.get("baseline"), list):
        raise QuickError(f"{path}: no 'mutants' and 'baseline' lists (not a `parity mutants --json` file?)")
    return data


def cost_model(kill: dict):
    """case -> estimated seconds (the module's COST MODEL)."""
    by_subject: dict = {}
    for row in kill["baseline"]:
        by_subject.setdefault(row["case"].split("-")[0], []).append(row["seconds"])
    overall = statistics.median(r["seconds"] for r in kill["baseline"])
    medians = {s: statistics.median(v) for s, v in by_subject.items()}

    def cost(case) -> float:
        return max(0.01, medians.get(case.subject, overall)) * max(1.0, case.world_size / 2)

    return cost


def killers(kill: dict, by_id: dict) -> list[tuple[str, str]]:
    """(case id, reason) for each killed cell's cheapest killer still in the case files."""
    chosen = []
    for mutant in kill["mutants"]:
        if mutant.get("equivalent"):
            continue
        for family, cell in sorted(mutant["cells"].items()):
            if cell["status"] != "killed":
                continue
            found = sorted((c["seconds"], c["case"]) for c in cell["cases"] if c["outcome"] == "killed")
            present = [cid for _, cid in found if cid in by_id]
            if not present:
                raise QuickError(f"{KILL_MATRIX}: mutant {mutant['mutant']} ({family}): none of its killers "
                                 f"({', '.join(cid for _, cid in found)}) is in the case files: rerun "
                                 "`parity mutants --json results/mutation/kill_matrix.json`")
            chosen.append((present[0], f"kills {mutant['mutant']} ({family})"))
    return chosen


def _axis_items(case, varying: dict) -> set:
    return {(case.subject, a, repr(v)) for a, v in case.axes if a in varying[case.subject]}


def _pairs(case, varying: dict) -> set:
    axes = [(a, repr(v)) for a, v in case.axes if a in varying[case.subject]]
    return {(case.subject, x, y) for x, y in combinations(axes, 2)}


def _greedy(cases, items_of, covered: set, cost, budget: float | None, spent: float):
    """Lazy greedy set cover: picks (index, new items) by most uncovered items per second until nothing new is
    left or the next pick would pass the budget; returns them and the seconds spent."""
    heap = [(-len(items_of(c)) / cost(c), i) for i, c in enumerate(cases)]
    heapq.heapify(heap)
    picks = []
    while heap:
        _, i = heapq.heappop(heap)
        new = items_of(cases[i]) - covered
        if not new:
            continue
        score = -len(new) / cost(cases[i])
        if heap and (score, i) > heap[0]:  # stale: put back with its current score
            heapq.heappush(heap, (score, i))
            continue
        if budget is not None and spent + cost(cases[i]) > budget:
            continue  # too dear for what is left; a cheaper case may still fit
        picks.append((i, new))
        covered |= new
        spent += cost(cases[i])
    return picks, spent


def compute(cases=None, kill: dict | None = None, budget: float = BUDGET_S) -> list[tuple[str, str]]:
    """(case id, why) in the default matrix's order."""
    cases = load() if cases is None else cases
    kill = read_kill_matrix() if kill is None else kill
    cost = cost_model(kill)
    by_id = {c.id: i for i, c in enumerate(cases)}
    why: dict = {}
    for cid, reason in killers(kill, by_id):
        why.setdefault(by_id[cid], []).append(reason)
    varying: dict = {}
    seen: dict = {}
    for c in cases:
        for a, v in c.axes:
            seen.setdefault(c.subject, {}).setdefault(a, set()).add(repr(v))
    varying = {s: {a for a, vs in axes.items() if len(vs) > 1} for s, axes in seen.items()}

    def coverage(c) -> set:
        items = {("subject", c.subject)} | {(c.subject, a, repr(v)) for a, v in c.axes}
        if c.divergence is not None:
            items |= {("finding", f.name) for f in c.divergence.findings}
        return items

    chosen = sorted(why)
    covered = set().union(*(coverage(cases[i]) for i in chosen)) if chosen else set()
    spent = sum(cost(cases[i]) for i in chosen)
    picks, spent = _greedy(cases, coverage, covered, cost, None, spent)
    for i, new in picks:
        named = sorted(n[1] for n in new if n[0] in ("subject", "finding"))
        values = sorted(f"{n[1]}={n[2]}" for n in new if n[0] not in ("subject", "finding"))
        why.setdefault(i, []).append("covers " + ", ".join(named + values[:4]) + (" ..." if len(values) > 4 else ""))
    pairs = set().union(*(_pairs(cases[i], varying) for i in why))
    picks, spent = _greedy(cases, lambda c: _pairs(c, varying), pairs, cost, budget, spent)
    for i, new in picks:
        why.setdefault(i, []).append(f"{len(new)} new axis-value pairs")
    return [(cases[i].id, "; ".join(why[i])) for i in sorted(why)]


def render(selection, kill: dict, budget: float = BUDGET_S, cases=None) -> str:
    cases = load() if cases is None else cases
    cost = cost_model(kill)
    by_id = {c.id: c for c in cases}
    total = sum(cost(by_id[cid]) for cid, _ in selection)
    head = [f"# The quick selection: generated by `{UPDATE}` (parity/matrix/quick.py says how); do not edit.",
            f"# {len(selection)} of {len(cases)} cases, estimated {total:.1f} case-seconds (budget {budget:g}).",
            "# case id <TAB> why it was chosen"]
    return "\n".join(head + [f"{cid}\t{reason}" for cid, reason in selection]) + "\n"


def update(path: Path = QUICK_FILE) -> str:
    kill = read_kill_matrix()
    cases = load()
    text = render(compute(cases, kill), kill, cases=cases)
    Path(path).write_text(text)
    return text


def quick_ids(path: Path = QUICK_FILE) -> list[str]:
    """The ids the committed quick file lists, in its order."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise QuickError(f"{path}: cannot read the quick selection: {exc.strerror or exc} (run `{UPDATE}`)") from None
    return [line.split("\t")[0] for line in lines if line and not line.startswith("#")]


def only_quick(cases, path: Path = QUICK_FILE) -> list:
    """The cases of `cases` the quick file lists (a --quick run narrows its other selections to these)."""
    wanted = set(quick_ids(path))
    return [c for c in cases if c.id in wanted]
