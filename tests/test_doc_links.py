"""Every docs/<page>.md link in parity/ and references/ names an existing page, and its #anchor a heading of
that page (the derivations, evidence and library internals live in docs/; the code links to them by section).
tests/checks/test_tolerance_links.py holds docs/tolerances.md to the same rule."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"docs/([A-Za-z0-9_-]+)\.md(?:#([A-Za-z0-9_-]+))?")
HEADING = re.compile(r"^#{1,6} (.+)$")


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list:
    """The page's headings (any level), outside fenced code blocks."""
    found, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.append(m.group(1))
    return found


def links() -> list:
    return [(path.relative_to(ROOT), m.group(1), m.group(2))
            for folder in ("parity", "references") for path in sorted((ROOT / folder).rglob("*.py"))
            for m in LINK.finditer(path.read_text())]


def test_github_anchor_rule():
    assert github_anchor("DeepSpeed's CPU shm op") == "deepspeeds-cpu-shm-op"
    assert github_anchor("HF tp_plan heads") == "hf-tp_plan-heads"
    assert github_anchor("TP x SP") == "tp-x-sp"
    assert github_anchor("A row's shared rounding") == "a-rows-shared-rounding"


def test_every_link_names_a_page_and_a_section():
    found = links()
    assert {page for _, page, _ in found} >= {"tolerances", "subjects"}, "no docs links found in parity/"
    broken = []
    for path, page, anchor in found:
        doc = DOCS / f"{page}.md"
        if not doc.is_file():
            broken.append(f"{path}: docs/{page}.md does not exist")
        elif anchor is not None and anchor not in {github_anchor(h) for h in headings(doc)}:
            broken.append(f"{path}: docs/{page}.md#{anchor} names no heading")
    assert not broken, "\n".join(broken)


def test_every_linked_page_has_unique_anchors():
    for page in sorted({page for _, page, _ in links()}):
        doc = DOCS / f"{page}.md"
        if doc.is_file():
            anchors = [github_anchor(h) for h in headings(doc)]
            assert len(set(anchors)) == len(anchors), f"docs/{page}.md repeats a heading's anchor"


def test_links_within_each_page_name_a_section():
    for doc in sorted(DOCS.glob("*.md")):
        known = {github_anchor(h) for h in headings(doc)}
        broken = [a for a in re.findall(r"\]\(#([^)]+)\)", doc.read_text()) if a not in known]
        assert not broken, f"{doc.name}: {broken}"


def test_subject_docstrings_link_their_section():
    """The subject modules whose prose moved to docs/subjects.md link to it."""
    moved = ("deepspeed_ce", "deepspeed_direct", "deepspeed_embed_spec", "deepspeed_embedding", "deepspeed_inference",
             "deepspeed_kl", "deepspeed_reach", "deepspeed_rejects", "deepspeed_row", "deepspeed_tied",
             "deepspeed_universal", "hf_tp_plan", "loss_scaling", "megatron_tp", "plain_sgd", "torch_tp")
    missing = [m for m in moved if "docs/subjects.md#" not in (ROOT / "parity" / "subjects" / f"{m}.py").read_text()]
    assert not missing, missing


MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def page_links(page: Path) -> list:
    """The relative link targets of a markdown page, outside fenced code blocks."""
    found, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            found += [t for t in MD_LINK.findall(line) if not t.startswith(("http://", "https://", "mailto:"))]
    return found


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    """A link's file exists, and its #anchor names a heading of the markdown page it points at."""
    broken = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in page_links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in {github_anchor(h) for h in headings(dest)}:
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
