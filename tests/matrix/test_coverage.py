"""The README's coverage table is generated from the case files and must match them."""
from pathlib import Path

from parity.matrix.cases import load
from parity.matrix.coverage import BEGIN, END, readme_block

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_coverage_table_is_current():
    text = README.read_text()
    assert BEGIN in text and END in text, "README lacks the coverage block"
    current = text[text.index(BEGIN):text.index(END) + len(END)]
    assert current == readme_block(load()), "run: python -m parity.matrix.coverage_update (README coverage table is stale)"
