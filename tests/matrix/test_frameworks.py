"""The cross-framework table of docs/subjects.md is generated from the case files and must match them;
every subject declares its framework and its feature of the table (or None: no head feature)."""
import pytest

from parity.matrix import frameworks
from parity.matrix.cases import SelectionError, load, select
from parity.matrix.coverage_update import PAGE
from parity.subjects import FRAMEWORKS, SUBJECTS


def test_subjects_page_framework_table_is_current():
    text = PAGE.read_text()
    assert frameworks.BEGIN in text and frameworks.END in text, "docs/subjects.md lacks the frameworks block"
    current = text[text.index(frameworks.BEGIN):text.index(frameworks.END) + len(frameworks.END)]
    assert current == frameworks.page_block(load()), \
        "the framework table of docs/subjects.md is stale: run python -m parity.matrix.coverage_update"


def test_every_subject_has_a_framework_and_a_place_in_the_table():
    # Declared on each subject's own class: one that inherited a head's row (a checkpoint resume of a head, say)
    # would count in that row unnoticed.
    for name, subject in SUBJECTS.items():
        if name.startswith("faulty"):
            continue
        assert subject.framework in FRAMEWORKS, name
        assert "feature" in vars(type(subject)), name
        assert subject.feature is None or subject.feature in frameworks.FEATURES_IN_ORDER, name


def test_table_counts_expected_outcomes():
    # Megatron's uneven vocabulary is a rejection, its fp32 vocab-parallel CE a known divergence.
    table = frameworks.framework_table(load())
    row = next(line for line in table.splitlines() if line.startswith(f"| {frameworks.VOCAB} |"))
    megatron = row.strip("|").split("|")[3].strip()
    parity, diverged, rejected = (int(n) for n in megatron.split(" / "))
    assert parity > 0 and diverged > 0 and rejected > 0


def test_select_by_framework():
    cases = load()
    chosen = select(cases, None, None, framework="megatron")
    assert chosen and all(SUBJECTS[c.subject].framework == "megatron" for c in chosen)
    assert len(select(cases, None, None, framework="torch")) == sum(
        SUBJECTS[c.subject].framework == "torch" for c in cases)
    with pytest.raises(SelectionError, match="unknown framework .*valid: deepspeed, liger, megatron, torch"):
        select(cases, None, None, framework="jax")
