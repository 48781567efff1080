"""The docs pages say each thing once, and docs/known-divergences.md (what has no finding) points at the registry: a
bullet there that names a finding's reproducer links that finding's section of docs/findings.md."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MIN_CHARS = 200


def units(text: str) -> list:
    """A page's paragraphs, bullet items and table rows, whitespace folded; fenced code left out."""
    found, current, fenced = [], [], False

    def flush():
        if current:
            found.append(" ".join(" ".join(current).split()))
            current.clear()
    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            fenced = not fenced
        elif fenced:
            continue
        elif not line.strip() or line.startswith(("#", "|")):
            flush()
            if line.startswith("|"):
                found.append(" ".join(line.split()))
        elif re.match(r"\s*([-*]|\d+\.) ", line) and not line.startswith("  "):
            flush()
            current.append(line)
        else:
            current.append(line)
    flush()
    return found


def test_no_paragraph_stands_in_two_pages():
    seen, repeated = {}, []
    for page in PAGES:
        for unit in set(units(page.read_text())):
            if len(unit) >= MIN_CHARS:
                if unit in seen:
                    repeated.append(f"{seen[unit]} and {page.name}: {unit[:100]}...")
                seen.setdefault(unit, page.name)
    assert not repeated, "\n".join(repeated)


def test_units_split_bullets_and_paragraphs():
    assert units("a\nb\n\n- c\n  d\n- e\n\n```sh\nx\n```\n| f |") == ["a b", "- c d", "- e", "| f |"]


def test_known_divergences_link_their_findings():
    """The page holds what has no finding; a bullet there that names a finding's reproducer links that finding."""
    owner = {}
    for path in (ROOT / "findings").glob("*.toml"):
        record = tomllib.loads(path.read_text())
        owner.update(dict.fromkeys(record["reproducers"], record["id"]))
    text = (ROOT / "docs" / "known-divergences.md").read_text()
    missing = []
    for bullet in re.split(r"\n(?=- )", text)[1:]:
        bullet = re.split(r"\n(?=\S)", bullet)[0]
        for repro in re.findall(r"ci/repro/[\w.-]+\.py", bullet):
            if repro in owner and f"(findings.md#{owner[repro]})" not in bullet:
                missing.append(f"{bullet[:80]}... -> {owner[repro]}")
    assert not missing, "\n".join(missing)
