"""pytest habits on case items: --lf, --ff, --sw (the cache provider is on and nodeids are stable)
and JUnit XML that keeps a failing case's rank tracebacks. Runs pytest on a scratch project whose
cases/ holds two of tests/cases/faulty.toml's cases, collected by this repository's own conftest."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PASSES = "faulty_always_rejects-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
FAILS = "faulty_always_rejects-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"


def project(tmp_path: Path) -> Path:
    (tmp_path / "cases").mkdir()
    text = (ROOT / "tests/cases/faulty.toml").read_text()
    # The two faulty_always_rejects tables: one expects the planted rejection, one a message never said.
    start = text.index('[[matrix]]\nsubject = "faulty_always_rejects"')
    end = text.index("# Known-divergence bookkeeping")
    (tmp_path / "cases/faulty.toml").write_text(text[start:end])
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("parity_conftest", {str(ROOT / "conftest.py")!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        globals().update({{k: v for k, v in vars(module).items() if k.startswith("pytest_")}})
        """))
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:randomly\n")
    return tmp_path


def pytest(where: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARITY_SUBJECT_MODULES": "tests.faulty_subjects"}
    env.pop("PARITY_STRICT", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-rA", *args], cwd=where, env=env,
                          capture_output=True, text=True, timeout=300)


def ran(result) -> list[str]:
    """Case ids in the order pytest reported them (-rA summary lines)."""
    return [line.split("::")[1].split()[0] for line in result.stdout.splitlines()
            if line.startswith(("PASSED ", "FAILED ")) and "::" in line]


def test_junit_keeps_rank_tracebacks_and_lf_ff_sw_work(tmp_path):
    where = project(tmp_path)
    first = pytest(where, "--junitxml=junit.xml")
    assert first.returncode == 1, first.stdout + first.stderr
    assert sorted(ran(first)) == sorted([PASSES, FAILS])
    assert (where / ".pytest_cache").is_dir()  # the cache provider is on

    failure = [tc for tc in ET.parse(where / "junit.xml").iter("testcase") if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failure] == [FAILS]
    text = failure[0].find("failure").text
    for rank in (0, 1):  # every rank's error and its traceback, as Verdict.explain writes them
        assert f"rank {rank}: ValueError: planted rejection" in text
    assert text.count("Traceback (most recent call last)") == 2
    assert f"reproduce: PARITY_SUBJECT_MODULES=tests.faulty_subjects parity run --matrix" in text

    last_failed = pytest(where, "--lf")
    assert ran(last_failed) == [FAILS], last_failed.stdout
    assert "rerun previous 1 failure" in last_failed.stdout

    # --ff puts the failure first; --sw stops there, so the passing case never runs.
    first_failed = pytest(where, "--ff", "--sw")
    assert ran(first_failed) == [FAILS], first_failed.stdout
    stepwise = pytest(where, "--sw")  # resumes at the recorded failure
    assert ran(stepwise) == [FAILS], stepwise.stdout
    assert "stepwise: skipping 1 already passed items" in stepwise.stdout, stepwise.stdout


def test_cache_dir_is_ignored_by_git():
    out = subprocess.run(["git", "check-ignore", "-q", ".pytest_cache/v/cache/lastfailed"], cwd=ROOT)
    assert out.returncode == 0
