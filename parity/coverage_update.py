"""Rewrite the README's coverage block from the case files: python -m parity.coverage_update"""
from pathlib import Path

from parity.cases import load
from parity.coverage import BEGIN, END, readme_block

if __name__ == "__main__":
    readme = Path(__file__).resolve().parent.parent / "README.md"
    text = readme.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    readme.write_text(text[:start] + readme_block(load()) + text[end:])
    print(f"updated {readme}")
