"""Rewrite the generated blocks (coverage, frameworks) of docs/subjects.md from the case files:
python -m parity.matrix.coverage_update"""
from pathlib import Path

from parity.matrix.cases import load
from parity.matrix import frameworks
from parity.matrix.coverage import BEGIN, END, page_block

# The page that holds both generated tables; tests/matrix/test_coverage.py and test_frameworks.py read it.
PAGE = Path(__file__).resolve().parents[2] / "docs" / "subjects.md"

if __name__ == "__main__":
    text = PAGE.read_text()
    cases = load()
    for begin, end_marker, block in ((BEGIN, END, page_block(cases)),
                                     (frameworks.BEGIN, frameworks.END, frameworks.page_block(cases))):
        start, end = text.index(begin), text.index(end_marker) + len(end_marker)
        text = text[:start] + block + text[end:]
    PAGE.write_text(text)
    print(f"updated {PAGE}")
