"""Small real `parity run --report` runs shared by the report and diff tests: each runs once per
test session, even under pytest-xdist (the workers share the directory through a file lock)."""
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent
FAULTY = ROOT / "tests" / "cases" / "faulty.toml"
HEADS = ROOT / "cases" / "deepspeed_heads.toml"
FAILING = "faulty_dropped_allreduce-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
PASSING = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
RUNS = {"failing_and_passing": (FAILING, PASSING), "passing": (PASSING,)}


def parity_run(directory, *case_ids):
    argv = [sys.executable, "-m", "parity.cli", "run", "--matrix", str(FAULTY), "--matrix", str(HEADS),
            "--timeout", "60", "--report", str(directory)]
    for case_id in case_ids:
        argv += ["--case", case_id]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def shared_report(tmp_path_factory, name: str) -> Path:
    """The report directory of run `name` (RUNS), made by whichever worker asks first."""
    root = tmp_path_factory.getbasetemp().parent  # common to every xdist worker of this session
    directory = root / f"report-{name}"
    with FileLock(str(root / f"report-{name}.lock"), timeout=600):
        if not (directory / "report.html").exists():
            proc = parity_run(directory, *RUNS[name])
            want = 1 if FAILING in RUNS[name] else 0
            assert proc.returncode == want, proc.stdout[-4000:] + proc.stderr[-4000:]
    return directory
