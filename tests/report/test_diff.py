"""`parity diff A B`: synthetic report directories for every kind of change, then two real small runs."""
import json

import pytest

from parity.cli import main
from tests.report_runs import FAILING, PASSING, shared_report


def report(directory, *cases):
    directory.mkdir()
    (directory / "summary.json").write_text(json.dumps({"cases": [
        {"id": case_id, "subject": "s", "axes": {"device": device, "vocab": 35}, "expect": "parity",
         "verdict": verdict, "worst_ratio": ratio, "reason": None}
        for case_id, verdict, ratio, device in cases]}))
    return str(directory)


@pytest.fixture
def runs(tmp_path):
    a = report(tmp_path / "a", ("c1", "passed", 0.2, "cpu"), ("c2", "failed", 3.0, "cpu"),
               ("c3", "passed", 0.1, "cpu"), ("c4", "passed", 0.3, "cpu"), ("gone", "passed", 0.1, "cpu"))
    b = report(tmp_path / "b", ("c1", "failed", 2.0, "cpu"), ("c2", "passed", 0.2, "cpu"),
               ("c3", "passed", 0.5, "cpu"), ("c4", "passed", 0.35, "cpu"), ("new", "failed", None, "cpu"))
    return a, b


def test_diff_lists_each_change_and_fails_when_a_verdict_got_worse(runs, capsys):
    a, b = runs
    assert main(["diff", a, b, "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert [(c["case"], c["worse"]) for c in result["verdict_changed"]] == [("c1", True), ("c2", False)]
    assert [c["case"] for c in result["only_in_a"]] == ["gone"]
    assert [(c["case"], c["worse"]) for c in result["only_in_b"]] == [("new", True)]
    # c3 moved 0.4 (listed), c4 0.05 (under the default 0.1); c1 and c2 moved too.
    assert {m["case"] for m in result["ratio_changed"]} == {"c1", "c2", "c3"}
    assert result["worse"] == 2
    assert main(["diff", a, b, "--ratio-change", "0.01"]) == 1
    table = capsys.readouterr().out
    assert "verdict changed (2):" in table and "WORSE" in table and "c4" in table and "2 got worse" in table


def test_diff_passes_when_nothing_got_worse(runs, capsys):
    a, b = runs
    assert main(["diff", b, b]) == 0
    assert "no differences" in capsys.readouterr().out
    assert main(["diff", b, a]) == 1  # c2 passed -> failed going this way


def test_diff_matches_cpu_and_gpu_runs_by_axes(tmp_path, capsys):
    cpu = report(tmp_path / "cpu", ("s-v35-cpu", "passed", 0.2, "cpu"))
    gpu = report(tmp_path / "gpu", ("s-v35-cuda", "failed", 5.0, "cuda"))
    assert main(["diff", cpu, gpu, "--json"]) == 1  # by id: nothing in common, a new failure only in B
    assert json.loads(capsys.readouterr().out)["compared"] == 0
    assert main(["diff", cpu, gpu, "--ignore-axis", "device", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["compared"] == 1 and result["verdict_changed"][0]["worse"]


def test_diff_names_what_makes_a_directory_not_a_report(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["diff", str(tmp_path / "empty"), str(tmp_path / "empty")]) == 2
    assert "summary.json is missing" in capsys.readouterr().err
    assert main(["diff", str(tmp_path / "nowhere"), str(tmp_path / "empty")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text('{"cases": [{"id": "x"}]}')
    assert main(["diff", str(tmp_path / "bad"), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "not a parity summary" in err and "'verdict'" in err


def test_diff_of_two_real_runs(tmp_path_factory, capsys):
    passing = str(shared_report(tmp_path_factory, "passing"))
    both = str(shared_report(tmp_path_factory, "failing_and_passing"))
    assert main(["diff", passing, both]) == 1  # a new failing case
    out = capsys.readouterr().out
    assert "only in B (1):" in out and FAILING in out and "1 got worse" in out
    assert main(["diff", both, passing, "--json"]) == 0  # the failing case dropped out: listed, not worse
    result = json.loads(capsys.readouterr().out)
    assert result["compared"] == 1 and [c["case"] for c in result["only_in_a"]] == [FAILING]
    assert not result["verdict_changed"] and PASSING not in {m["case"] for m in result["ratio_changed"]}
