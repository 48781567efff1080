"""Rewrite the README's coverage block from the case files: python -m parity.matrix.coverage_update"""
from pathlib import Path

from parity.matrix.cases import load
from parity.matrix.coverage import BEGIN, END, readme_block

if __name__ == "__main__":
    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    readme.write_text(text[:start] + readme_block(load()) + text[end:])
    print(f"updated {readme}")
