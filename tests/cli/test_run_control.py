"""`parity run` end to end on faulty subjects: -x and --rerun-failed, Ctrl-C (a partial report
marked interrupted, exit 130), and PARITY_SUBJECT_MODULES resolved from the current directory as
the console script needs (its sys.path holds its bin directory, not the directory it runs in)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTY = "tests/cases/faulty.toml"
PASSES = "faulty_always_rejects-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
FAILS = "faulty_always_rejects-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
HANGS = "faulty_hangs_on_rank0-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
ENV = {**os.environ, "PARITY_SUBJECT_MODULES": "tests.faulty_subjects"}
ENV.pop("PARITY_STRICT", None)


def parity(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parity.cli", "run", "--matrix", FAULTY, *args], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=240, **kwargs)


def test_exitfirst_then_rerun_failed(tmp_path):
    first = parity("--case", FAILS, "--case", PASSES, "-x", "--report", str(tmp_path / "a"))
    assert first.returncode == 1, first.stdout + first.stderr
    assert "0 passed, 1 failed, 0 skipped, 1 not run" in first.stdout
    summary = json.loads((tmp_path / "a/summary.json").read_text())
    assert [c["id"] for c in summary["cases"]] == [FAILS]
    assert summary["not_run"] == [{"id": PASSES, "reason": "not run: stopped after 1 failed (--maxfail 1)"}]

    again = parity("--rerun-failed", str(tmp_path / "a"), "--report", str(tmp_path / "b"))
    assert again.returncode == 1, again.stdout + again.stderr
    assert [c["id"] for c in json.loads((tmp_path / "b/summary.json").read_text())["cases"]] == [FAILS]


def _sigint_as_in_a_terminal():
    # A shell without job control starts a background command (`.ci/run ... &`, nohup, a CI step
    # some runners start that way) with SIGINT ignored, children inherit that, and Python installs
    # its KeyboardInterrupt handler only over the default: the run would never see the Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("jobs", ["1", "2"])  # one Runner here, or job processes holding the cases
def test_ctrl_c_prints_what_ran_and_writes_a_partial_report(tmp_path, jobs):
    proc = subprocess.Popen([sys.executable, "-m", "parity.cli", "run", "--matrix", FAULTY, "--case", PASSES,
                             "--case", HANGS, "--case", FAILS, "--timeout", "200", "--report", str(tmp_path),
                             "-j", jobs],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_sigint_as_in_a_terminal)
    lines = []
    deadline = time.monotonic() + 200
    for line in proc.stdout:  # the second case hangs: interrupt once the first one is judged
        lines.append(line)
        if line.startswith("[1/3]"):
            time.sleep(3)  # mid-case, as a person presses it
            proc.send_signal(signal.SIGINT)
            break
        assert time.monotonic() < deadline, "".join(lines)
    rest, _ = proc.communicate(timeout=120)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out
    assert "Traceback" not in out, out
    assert "interrupted: 1 of 3 cases ran" in out
    assert "1 passed, 0 failed, 0 skipped, 2 not run" in out
    assert "(partial: interrupted)" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert [c["id"] for c in summary["cases"]] == [PASSES]
    assert summary["not_run"] == [{"id": i, "reason": "not run: interrupted (Ctrl-C)"} for i in (HANGS, FAILS)]


def _alive(processes) -> list:
    import psutil

    alive = []
    for p in processes:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_killed_run_leaves_no_rank_behind(jobs):
    """SIGKILL (an OOM killer, a CI timeout) gives parity run no chance to close its ranks. Forked from
    a forkserver, they are not its children, and the forkserver outlives it (each rank holds its alive
    pipe): without rank_worker._die_with_owner they waited on their queues for ever."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-m", "parity.cli", "run", "--matrix", FAULTY, "--case", PASSES,
                             "--case", HANGS, "--timeout", "200", "-j", jobs],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # the second case hangs on rank 0: its group is alive now
        if line.startswith("[1/2]"):
            break
    time.sleep(2)
    left = psutil.Process(proc.pid).children(recursive=True)
    assert left, "no rank processes found under the run"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while (left := _alive(left)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in left:  # leave nothing behind for the next test either
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, f"processes of the killed run still alive 30 s later: {sorted(p.pid for p in left)}"


def test_subject_module_from_the_current_directory_as_the_console_script_runs(tmp_path):
    (tmp_path / "bin").mkdir()
    # What pip's `parity` entry point does: sys.path[0] is the script's own directory.
    (tmp_path / "bin/parity").write_text("import sys\nfrom parity.cli import main\nif __name__ == '__main__':\n"
                                         "    sys.exit(main())\n")
    (tmp_path / "my_subjects.py").write_text(textwrap.dedent("""
        from tests.faulty_subjects import DroppedInputGradAllReduce

        class Mine(DroppedInputGradAllReduce):
            name = "mine_dropped_allreduce"

        SUBJECTS = [Mine()]
        """))
    (tmp_path / "mine.toml").write_text('[[matrix]]\nsubject = "mine_dropped_allreduce"\n[matrix.axes]\nvocab = [35]\n')
    env = {**ENV, "PARITY_SUBJECT_MODULES": "my_subjects", "PYTHONPATH": str(ROOT)}  # parity itself, from this tree
    out = subprocess.run([sys.executable, "bin/parity", "run", "--matrix", "mine.toml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 1, out.stdout + out.stderr  # the rank processes found it too: the case ran and failed
    assert "check failed: head_input_grad" in out.stdout
    assert "reproduce: PARITY_SUBJECT_MODULES=my_subjects parity run --matrix mine.toml --case mine_dropped_allreduce-" \
        in out.stdout

    missing = subprocess.run([sys.executable, "bin/parity", "list"], cwd=tmp_path, capture_output=True, text=True,
                             env={**env, "PARITY_SUBJECT_MODULES": "not_here"}, timeout=120)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (f"parity: PARITY_SUBJECT_MODULES: cannot import 'not_here' (looked on sys.path "
                                      f"and in {tmp_path}): No module named 'not_here'")


@pytest.mark.parametrize("jobs", ["1", "2"])  # one Runner here, or job processes holding the cases
def test_exitfirst_exits_within_seconds_of_the_failure(jobs):
    """-x decided, the case under way beside it (here one that hangs for the whole --timeout) is killed, not
    waited for: before, a Runner's groups were closed politely (10 s a rank) and a job finished its batch
    (up to 20 s) before the run could exit."""
    proc = subprocess.Popen([sys.executable, "-m", "parity.cli", "run", "--matrix", FAULTY, "--case", FAILS,
                             "--case", HANGS, "--case", PASSES, "--timeout", "200", "-x", "-j", jobs],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, failed_at = [], None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[1/3]") and failed_at is None:
            failed_at = time.monotonic()
    proc.wait(timeout=200)
    out = "".join(lines)
    assert failed_at is not None, out
    assert proc.returncode == 1, out
    assert "0 passed, 1 failed, 0 skipped, 2 not run" in out, out
    assert time.monotonic() - failed_at < 10, f"exited {time.monotonic() - failed_at:.1f} s after the failure:\n{out}"
