"""pytest --parity-report DIR: bad input is a usage error naming what is allowed. (That the report
gathers the verdicts of every xdist worker is shown by tests/test_modal_runner.py's local run.)"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_file_is_not_a_report_directory(tmp_path):
    target = tmp_path / "a_file"
    target.write_text("")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--parity-report", str(target), "--collect-only", "-q",
                           "tests/test_partition.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert f"--parity-report {target}: exists and is not a directory" in proc.stderr
    assert "allowed: a directory, created if missing" in proc.stderr
