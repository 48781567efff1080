"""The quick selection (cases/quick.txt) is computed, never edited: it must be what parity/matrix/quick.py computes
now from the case files, the findings and the kill matrix, and hold what it promises."""
import json

import pytest

from parity.matrix import quick
from parity.matrix.cases import load


@pytest.fixture(scope="module")
def current():
    cases, kill = load(), quick.read_kill_matrix()
    return cases, kill, quick.compute(cases, kill)


def test_quick_file_is_current(current):
    cases, kill, selection = current
    assert quick.QUICK_FILE.read_text() == quick.render(selection, kill, cases=cases), \
        f"cases/quick.txt is stale against the case files, findings or kill matrix: run `{quick.UPDATE}`"


def test_quick_selection_keeps_its_promises(current):
    cases, kill, selection = current
    ids = {cid for cid, _ in selection}
    chosen = [c for c in cases if c.id in ids]
    # a killer of every killed (mutant, family) cell
    for mutant in kill["mutants"]:
        for family, cell in mutant["cells"].items():
            if cell["status"] == "killed" and not mutant.get("equivalent"):
                assert ids & {c["case"] for c in cell["cases"] if c["outcome"] == "killed"}, (mutant["mutant"], family)
    # every subject, axis value of each subject and finding
    for c in cases:
        assert any(q.subject == c.subject for q in chosen), c.subject
    values = {(c.subject, a, repr(v)) for c in cases for a, v in c.axes}
    assert values == {(c.subject, a, repr(v)) for c in chosen for a, v in c.axes}
    found = {f.name for c in cases if c.divergence for f in c.divergence.findings}
    assert found == {f.name for c in chosen if c.divergence for f in c.divergence.findings}
    # the pairs stop at the budget (what steps 1 and 2 need is spent whatever the budget)
    cost = quick.cost_model(kill)
    pairs_only = [c for c in chosen if dict(selection)[c.id].endswith("new axis-value pairs")]
    assert not pairs_only or sum(cost(c) for c in chosen) <= quick.BUDGET_S

def test_a_dropped_killer_fails_loudly(current):
    cases, kill, _ = current
    gone = json.loads(json.dumps(kill))
    cell = next(c for m in gone["mutants"] for c in m["cells"].values() if c["status"] == "killed")
    for row in cell["cases"]:
        row["case"] = "no_such_case-" + row["case"]
    with pytest.raises(quick.QuickError, match="none of its killers"):
        quick.compute(cases, gone)


def test_pairs_fill_a_larger_budget_and_stop_at_it(current):
    cases, kill, selection = current
    cost, by_id = quick.cost_model(kill), {c.id: c for c in cases}
    floor = sum(cost(by_id[cid]) for cid, _ in selection)
    wider = quick.compute(cases, kill, budget=floor + 20)
    assert {cid for cid, _ in selection} <= {cid for cid, _ in wider}
    assert any(why.endswith("new axis-value pairs") for _, why in wider)
    assert sum(cost(by_id[cid]) for cid, _ in wider) <= floor + 20
