"""The cross-framework table of docs/subjects.md: per feature and framework, how many cases of each expected outcome.

Generated from the case files like the coverage table (parity/matrix/coverage.py) and kept current by
tests/matrix/test_frameworks.py. A cell is "parity / known div. / rejection": the outcome the case file
declares, not a run's result. Each subject declares its row (Subject.feature) and its column (Subject.framework).
"""
from __future__ import annotations

from collections import Counter

BEGIN, END = "<!-- frameworks:begin -->", "<!-- frameworks:end -->"
COLUMN, VOCAB, ROW, EMBED, TIED = ("column head (gathered logits)", "vocab-parallel head + CE", "row head",
                                   "vocab-parallel embedding", "tied embedding / head")
FEATURES_IN_ORDER = (COLUMN, VOCAB, ROW, EMBED, TIED)
# Column headers of the frameworks known here, in the table's order; a framework not named here gets a column
# headed by its own name, after these. A framework is a column where any of its subjects has a feature (Liger has
# only a loss, no head, so it is none).
FRAMEWORK_TITLES = {"deepspeed": "DeepSpeed", "torch": "PyTorch DTensor", "megatron": "Megatron-core"}


def framework_columns() -> dict:
    """Subject.framework -> column header, for every framework with a subject in a row of the table."""
    from parity.subjects import FRAMEWORKS, SUBJECTS

    with_rows = {s.framework for s in SUBJECTS.values() if s.feature}
    ordered = [fw for fw in FRAMEWORK_TITLES if fw in with_rows] + [fw for fw in FRAMEWORKS if fw in with_rows
                                                                    and fw not in FRAMEWORK_TITLES]
    return {fw: FRAMEWORK_TITLES.get(fw, fw) for fw in ordered}


def feature(case) -> str | None:
    """A case's feature (Subject.feature), except that a tied case of an embedding subject is the tied feature."""
    from parity.subjects import SUBJECTS

    found = SUBJECTS[case.subject].feature
    if found == EMBED and case.values.optional("tied", False):
        return TIED
    return found


def _outcome(case) -> str:
    return "rejection" if case.expect.is_error else "divergence" if case.divergence else "parity"


def framework_table(cases) -> str:
    from parity.subjects import SUBJECTS

    columns = framework_columns()
    counts = {}
    for c in cases:
        feat, fw = feature(c), SUBJECTS[c.subject].framework
        if feat and fw in columns:
            counts.setdefault((feat, fw), Counter())[_outcome(c)] += 1
    header = ["feature"] + list(columns.values())
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for feat in FEATURES_IN_ORDER:
        cells = []
        for fw in columns:
            k = counts.get((feat, fw))
            cells.append(f"{k['parity']} / {k['divergence']} / {k['rejection']}" if k else "-")
        lines.append("| " + " | ".join([feat] + cells) + " |")
    return "\n".join(lines)


def page_block(cases) -> str:
    return f"{BEGIN}\n{framework_table(cases)}\n{END}"
