"""The coverage table of docs/subjects.md is generated from the case files and must match them."""
from parity.matrix.cases import load
from parity.matrix.coverage import BEGIN, END, page_block
from parity.matrix.coverage_update import PAGE


def test_subjects_page_coverage_table_is_current():
    text = PAGE.read_text()
    assert BEGIN in text and END in text, "docs/subjects.md lacks the coverage block"
    current = text[text.index(BEGIN):text.index(END) + len(END)]
    assert current == page_block(load()), "run: python -m parity.matrix.coverage_update (the coverage table of docs/subjects.md is stale)"
