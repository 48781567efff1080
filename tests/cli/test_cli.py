"""Errors a user can act on: one line on stderr, no traceback, exit status 2 (1 means a case failed);
--version; help text on every subcommand and option; reproducers that carry their environment."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.checks.verdict import FAILED, Verdict, repro_env
from parity.settings import RunSettings
from parity.cli import build_parser, main, rerun_ids
from parity.matrix.cases import load

ROOT = Path(__file__).resolve().parents[2]
FAULTY = str(ROOT / "tests/cases/faulty.toml")


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, says", [
    (["list", "-k", "vocab and ("], "bad -k expression 'vocab and ('"),
    (["run", "-k", "not"], "bad -k expression 'not'"),
    (["list", "--case", "nosuch"], "no case with id 'nosuch'"),
    (["run", "--case", "nosuch"], "no case with id 'nosuch'"),
    (["run", "-k", "no_case_has_this_in_its_id"], "no cases selected"),
    (["mutants", "--mutant", "nosuch"], "unknown mutant 'nosuch'"),
    (["run", "--rerun-failed", "/nonexistent/report"], "--rerun-failed /nonexistent/report: cannot read"),
    (["run", "--launcher", "torchrun", "-x"], "-x/--maxfail works with --launcher spawn only"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, says):
    assert says in one_line_error(capsys, argv)


def test_unknown_mutant_in_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("PARITY_MUTANT", "nosuch")
    assert "PARITY_MUTANT=nosuch: no such mutant" in one_line_error(capsys, ["run", "--case", "x"])


def test_rerun_failed_needs_the_matrix_the_run_used(capsys, tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"cases": [{"id": "faulty_x", "verdict": "failed"}]}))
    err = one_line_error(capsys, ["run", "--rerun-failed", str(tmp_path)])
    assert "no case with id 'faulty_x'" in err and "pass the --matrix that run used" in err
    (tmp_path / "summary.json").write_text("{")
    assert "is not JSON" in one_line_error(capsys, ["run", "--rerun-failed", str(tmp_path)])


def test_rerun_failed_picks_failures_and_under_strict_xpasses(tmp_path):
    cases = [{"id": i, "verdict": v} for i, v in
             [("a", "passed"), ("b", "failed"), ("c", "xpassed"), ("d", "skipped"), ("e", "diverged")]]
    (tmp_path / "summary.json").write_text(json.dumps({"cases": cases}))
    assert rerun_ids(str(tmp_path), strict=False) == ["b"]
    assert rerun_ids(str(tmp_path), strict=True) == ["b", "c"]


def test_nothing_to_rerun_is_not_an_error(capsys, tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"cases": [{"id": "a", "verdict": "passed"}]}))
    assert main(["run", "--rerun-failed", str(tmp_path)]) == 0
    assert "nothing to rerun" in capsys.readouterr().out


def test_a_bad_case_file_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[matrix]]\nsubject = 'nosuch'\n")
    assert "bad case file" in one_line_error(capsys, ["list", "--matrix", str(bad)])


def run_cli(*args, env=None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parity.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120, **kwargs)


def test_unimportable_subject_module_is_one_line():
    out = run_cli("list", env={"PARITY_SUBJECT_MODULES": "no_such_pkg.subjects"})
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "PARITY_SUBJECT_MODULES: cannot import 'no_such_pkg.subjects'" in out.stderr


def test_list_into_a_closed_pipe_exits_quietly():
    # `parity list | head -1`: the reader closes the pipe after one line.
    proc = subprocess.Popen([sys.executable, "-m", "parity.cli", "list"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    proc.wait(timeout=120)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("parity ")


def parsers(parser: argparse.ArgumentParser, path="parity"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{path} {name}")


def test_every_subcommand_and_option_has_help():
    missing = []
    for path, parser in parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {a.dest}" for a in action._choices_actions if not a.help]
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []
    assert {p for p, _ in parsers(build_parser())} >= {"parity list", "parity run", "parity diff",
                                                        "parity mutants", "parity bench"}


def test_the_help_walk_can_fail():
    parser = argparse.ArgumentParser()
    parser.add_argument("--undocumented")
    assert [a.dest for a in parser._actions if not a.help] == ["undocumented"]


def test_repro_carries_environment_and_strict(monkeypatch):
    case = next(c for c in load([FAULTY]) if c.subject == "faulty_dropped_allreduce")
    monkeypatch.setenv("PARITY_SUBJECT_MODULES", "tests.faulty_subjects")
    monkeypatch.setenv("PARITY_MUTANT", "ce_local_max")
    verdict = Verdict(case, FAILED, env=repro_env(case, RunSettings.from_env()), strict=True)
    matrix = case.source.rsplit(":", 1)[0]
    assert verdict.repro() == (f"PARITY_MUTANT=ce_local_max PARITY_SUBJECT_MODULES=tests.faulty_subjects "
                               f"parity run --matrix {matrix} --case {case.id} --strict")
    monkeypatch.delenv("PARITY_MUTANT")
    monkeypatch.delenv("PARITY_SUBJECT_MODULES")
    assert Verdict(case, FAILED, env=repro_env(case, RunSettings.from_env())).repro() == f"parity run --matrix {matrix} --case {case.id}"


def test_repro_names_the_visible_gpus_of_a_cuda_case(monkeypatch):
    case = next(c for c in load() if c.values.optional("device", None) == "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    monkeypatch.delenv("PARITY_SUBJECT_MODULES")  # tests/conftest.py sets it for the whole session
    assert Verdict(case, FAILED, env=repro_env(case, RunSettings.from_env())).repro().startswith("CUDA_VISIBLE_DEVICES=1,2 parity run ")
    cpu = next(c for c in load() if c.values.optional("device", None) == "cpu")
    assert "CUDA_VISIBLE_DEVICES" not in repro_env(cpu, RunSettings.from_env())
