"""Rewrite the README's generated blocks (coverage, frameworks) from the case files:
python -m parity.matrix.coverage_update"""
from pathlib import Path

from parity.matrix.cases import load
from parity.matrix import frameworks
from parity.matrix.coverage import BEGIN, END, readme_block

if __name__ == "__main__":
    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text()
    cases = load()
    for begin, end_marker, block in ((BEGIN, END, readme_block(cases)),
                                     (frameworks.BEGIN, frameworks.END, frameworks.readme_block(cases))):
        start, end = text.index(begin), text.index(end_marker) + len(end_marker)
        text = text[:start] + block + text[end:]
    readme.write_text(text)
    print(f"updated {readme}")
