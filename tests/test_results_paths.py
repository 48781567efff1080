"""Every results/ path README.md and docs/*.md cite, and every relative link in results/'s own
README indexes, names a file or folder that exists: results/ is pruned by hand, and a claim whose
evidence moved should fail here, not in a reader's browser."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A results/ path, unless it is a git object reference (`d3f90f5:results/...`) of a removed file.
RESULTS_PATH = re.compile(r"(?<![0-9a-f]{7}:)results/[A-Za-z0-9_.\-/]+")
MD_LINK = re.compile(r"\]\(([^)\s#]+)")


def _cited(text: str) -> set[str]:
    return {m.group(0).rstrip(".,;:/") for m in RESULTS_PATH.finditer(text)}


def test_readme_and_docs_cite_results_paths_that_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [(page.name, path) for page in pages for path in sorted(_cited(page.read_text()))
               if not (ROOT / path).exists()]
    assert not missing


def test_results_indexes_link_files_that_exist():
    missing = []
    for page in sorted((ROOT / "results").rglob("*.md")):
        for target in MD_LINK.findall(page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                missing.append((str(page.relative_to(ROOT)), target))
    assert not missing


def test_every_results_folder_has_an_index():
    folders = [d for d in (ROOT / "results").rglob("*") if d.is_dir()] + [ROOT / "results"]
    assert [str(d.relative_to(ROOT)) for d in folders if not (d / "README.md").exists()] == []
