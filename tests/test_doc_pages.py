"""The docs pages say each thing once, and the known-divergence prose points at the registry: every entry whose
reproducer belongs to a finding links that finding's section of docs/findings.md."""
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
    owner = {}
    for path in (ROOT / "findings").glob("*.toml"):
        record = tomllib.loads(path.read_text())
        owner.update(dict.fromkeys(record["reproducers"], record["id"]))
    text = (ROOT / "docs" / "known-divergences.md").read_text()
    missing = []
    for entry in re.split(r"\n(?=- \*\*)", text)[1:]:
        entry = re.split(r"\n(?=\S)", entry)[0]
        close = entry.index("**", 4) + 2  # the bold heading, then the rest of the line it closes on
        heading = entry[:entry.find("\n", close) % (len(entry) + 1)]
        for repro in re.findall(r"ci/repro/[\w.-]+\.py", entry):
            if repro in owner and f"(findings.md#{owner[repro]})" not in heading:
                missing.append(f"{entry[:80]}... -> {owner[repro]}")
    assert not missing, "\n".join(missing)
