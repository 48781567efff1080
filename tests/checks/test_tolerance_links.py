"""Every docs/tolerances.md#anchor link in parity/ names a heading of docs/tolerances.md (the derivations
and evidence behind the bounds live there; the code links to them by section)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tolerances.md"
LINK = re.compile(r"docs/tolerances\.md#([A-Za-z0-9_-]+)")


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors() -> set:
    return {github_anchor(line[3:]) for line in DOC.read_text().splitlines() if line.startswith("## ")}


def test_github_anchor_rule():
    assert github_anchor("A row's shared rounding") == "a-rows-shared-rounding"
    assert github_anchor("Small tensors and the sampled max") == "small-tensors-and-the-sampled-max"
    assert github_anchor("The element-wise criterion") == "the-element-wise-criterion"


def test_every_link_names_a_section():
    known = anchors()
    links = [(path.relative_to(ROOT), m.group(1)) for path in sorted((ROOT / "parity").rglob("*.py"))
             for m in LINK.finditer(path.read_text())]
    assert links, "no docs/tolerances.md links found in parity/"
    broken = [f"{path}: #{anchor}" for path, anchor in links if anchor not in known]
    assert not broken, "links to no heading of docs/tolerances.md:\n" + "\n".join(broken)


def test_section_anchors_are_unique():
    headings = [line[3:] for line in DOC.read_text().splitlines() if line.startswith("## ")]
    assert len({github_anchor(h) for h in headings}) == len(headings)


def test_links_within_the_page_name_a_section():
    known = anchors()
    broken = [a for a in re.findall(r"\]\(#([^)]+)\)", DOC.read_text()) if a not in known]
    assert not broken, broken
