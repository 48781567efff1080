"""The findings registry (findings/*.toml, one file per root cause) covers every reproducer and named mark exactly
once, every case's known divergence reports by a finding of it, every reproducer names its finding, and
docs/findings.md is the registry's page as `parity findings --markdown` writes it."""
import ast
import json
from pathlib import Path

import pytest

from parity.cli import main
from parity.matrix import cases as cases_module
from parity.matrix.cases import CaseFileError, findings, findings_by_repro, load, load_file, named_marks
from parity.report.findings import markdown

ROOT = Path(__file__).resolve().parents[1]
REPROS = sorted(f"ci/repro/{p.name}" for p in (ROOT / "ci" / "repro").glob("*.py") if not p.name.startswith("_"))


def test_every_reproducer_belongs_to_exactly_one_finding():
    owners = findings_by_repro()
    assert {r: owners.get(r, []) for r in REPROS if len(owners.get(r, [])) != 1} == {}
    assert sorted(r for r in owners if not (ROOT / r).is_file()) == []  # every listed reproducer exists


def test_every_named_mark_belongs_to_exactly_one_finding_and_says_so():
    marks = named_marks()
    listed = [(m, fid) for fid, f in findings().items() for m in f["marks"]]
    assert sorted(m for m, _ in listed if m not in marks) == []  # every listed mark exists
    owner = dict(listed)
    assert len(owner) == len(listed), "a mark listed by two findings"
    assert {m: (t.get("finding"), owner.get(m)) for m, t in marks.items() if t.get("finding") != owner.get(m)} == {}
    # A mark is an instance of its finding: its reproducer is one of the finding's.
    assert {m: t["repro"] for m, t in marks.items() if t["repro"] not in findings()[owner[m]]["reproducers"]} == {}


def test_every_case_divergence_reports_by_a_finding():
    registry = findings()
    marked = [c for c in load() if c.divergence is not None]
    assert marked
    assert sorted({f.name for c in marked for f in c.divergence.findings} - set(registry)) == []


def test_every_reproducer_names_its_finding():
    owners = findings_by_repro()
    wrong = {}
    for repro in REPROS:
        doc = ast.get_docstring(ast.parse((ROOT / repro).read_text())) or ""
        want = f"Finding: findings/{owners[repro][0]}.toml"
        if want not in doc.splitlines():
            wrong[repro] = want
    assert wrong == {}


def test_the_docs_page_is_the_registrys():
    assert (ROOT / "docs" / "findings.md").read_text() == markdown(findings()), (
        "docs/findings.md is stale: run `parity findings --markdown docs/findings.md`")


INLINE = """
[[matrix]]
subject = "vocab_parallel"
[matrix.known_divergence]
reason = "x"
repro = "ci/repro/liger_double_backward.py"
"""


def registry(tmp_path, monkeypatch, owners: list[str]):
    folder = tmp_path / "findings"
    folder.mkdir()
    for fid in owners:
        (folder / f"{fid}.toml").write_text(
            f'id = "{fid}"\ntitle = "t"\nlibrary = "liger-kernel"\nversions = ["0.8.5"]\n'
            'class = "silent wrong numbers"\n'
            'mechanism = "m"\nreproducers = ["ci/repro/liger_double_backward.py"]\nmarks = []\nupstream = "u"\n'
            'fix = "f"\n')
    monkeypatch.setattr(cases_module, "FINDINGS_DIR", folder)
    path = tmp_path / "m.toml"
    path.write_text(INLINE)
    return path


def test_an_inline_entry_takes_the_finding_of_its_reproducer(tmp_path, monkeypatch):
    case = load_file(registry(tmp_path, monkeypatch, ["only_one"]))[0]
    assert case.divergence.name == "only_one"


@pytest.mark.parametrize("owners, problem", [([], "belongs to no finding"), (["a", "b"], "belongs to 2 findings")])
def test_a_reproducer_of_no_or_two_findings_is_a_case_file_error(tmp_path, monkeypatch, owners, problem):
    with pytest.raises(CaseFileError, match=problem):
        load_file(registry(tmp_path, monkeypatch, owners))


def test_an_unknown_finding_is_a_case_file_error(tmp_path, monkeypatch):
    path = registry(tmp_path, monkeypatch, ["only_one"])
    path.write_text(INLINE + 'finding = "nope"\n')
    with pytest.raises(CaseFileError, match="unknown finding 'nope'"):
        load_file(path)


def test_parity_findings_json_counts_every_finding(capsys):
    assert main(["findings", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert sorted(r["id"] for r in table) == sorted(findings())
    assert sum(r["reproducers"] for r in table) == len(REPROS)
    assert all(r["cases"] >= 0 and r["record"]["id"] == r["id"] for r in table)


def test_parity_findings_issue_is_an_upstream_report(capsys):
    assert main(["findings", "--issue", "megatron_label_smoothing_local_vocab"]) == 0
    out = capsys.readouterr().out
    assert "python ci/repro/megatron_label_smoothing_one_entry_shard.py" in out and "## Suggested fix" in out
    assert main(["findings", "--issue", "nope"]) == 2


def test_a_stuck_reproducer_reads_changed_and_the_check_goes_on(tmp_path, monkeypatch):
    """A reproducer past its time is killed with what it started and reported as an error; the others still run."""
    from parity.report import findings as report

    stuck, present = tmp_path / "stuck.py", tmp_path / "present.py"
    stuck.write_text("import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; "
                     "time.sleep(600)'])\ntime.sleep(600)\n")
    present.write_text("raise SystemExit(1)\n")
    monkeypatch.setattr(report, "REPRODUCER_TIMEOUT_S", 3)
    registry = {"a": {"reproducers": [str(stuck)]}, "b": {"reproducers": [str(present)]}}
    found = {f["id"]: f for f in report.check(registry, ["a", "b"], [])}
    assert found["a"]["status"] == "changed"
    assert found["a"]["reproducers"][str(stuck)].startswith("error (still running after 3 s")
    assert found["b"]["status"] == "present"


def test_a_reproducer_that_cannot_run_here_is_named_not_changed(tmp_path, monkeypatch):
    """Exit 2 is a reproducer's "this machine lacks what I need": the finding reads not run here (a skip, a failure
    only in strict mode), and a finding with one reproducer present beside it stays present."""
    from parity.report import findings as report

    absent, present = tmp_path / "absent.py", tmp_path / "present.py"
    absent.write_text("raise SystemExit(2)\n")
    present.write_text("raise SystemExit(1)\n")
    registry = {"a": {"reproducers": [str(absent)]}, "b": {"reproducers": [str(absent), str(present)]}}
    found = {f["id"]: f for f in report.check(registry, ["a", "b"], [])}
    assert found["a"]["status"] == report.NOT_HERE and found["b"]["status"] == "present"
    assert "0 changed, 1 not run here" in report.format_check(list(found.values()))
