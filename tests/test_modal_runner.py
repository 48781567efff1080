"""ci/modal_runner.py without Modal: it imports, its local mode runs the GPU job's command here, and
the Modal path would send that same command. No GPU here, so the local run must fail loudly (strict:
"needs a CUDA device") rather than pass or skip; a tiny -k selection keeps it to seconds."""
import importlib.util
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "ci" / "modal_runner.py"
# Matches a CPU and a cuda case at TP=2 and TP=4 each; -m gpu must keep only the cuda ones.
SELECTION = ["-k", "liger_vocab_ce-fp32-v32-ign_none and not ls0", "cases/liger_ce.toml"]


def _runner_without_modal():
    saved = sys.modules.get("modal")
    sys.modules["modal"] = None  # makes `import modal` raise ModuleNotFoundError, installed or not
    try:
        spec = importlib.util.spec_from_file_location("modal_runner_under_test", RUNNER)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["modal"]
        else:
            sys.modules["modal"] = saved
    return module


def test_imports_and_refuses_the_modal_path_without_modal(capsys):
    runner = _runner_without_modal()
    assert runner.modal is None and runner.app is None
    assert runner.main(["--gpu", "L40S:2"]) == 2
    assert "pip install modal" in capsys.readouterr().err


def test_modal_path_sends_the_local_command():
    runner = _runner_without_modal()
    extra = ["-k", "tp2"]
    local = runner.pytest_command(sys.executable, "reports/x", "3", extra)
    remote = runner.modal_request("3", "reports/x", extra)
    assert remote == ["python"] + local[1:]
    assert local[1:6] == ["-m", "pytest", "-n", "3", "-m"] and local[6] == "gpu" and local[-2:] == extra


def test_gpu_spec_is_checked(monkeypatch):
    runner = _runner_without_modal()
    monkeypatch.delenv(runner.GPU_ENV, raising=False)
    assert runner.gpu_spec(None) == runner.DEFAULT_GPU
    monkeypatch.setenv(runner.GPU_ENV, "H100:2")
    assert runner.gpu_spec(None) == "H100:2" and runner.gpu_spec("L40S") == "L40S"
    with pytest.raises(ValueError, match="TYPE or TYPE:COUNT"):
        runner.gpu_spec("H100:two")
    with pytest.raises(SystemExit):
        runner.parse_args(["--local", "--gpu", "H100:2"])


def test_local_mode_fails_loudly_without_a_gpu(tmp_path):
    report = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, str(RUNNER), "--local", "--report-dir", str(report), "--", "-q", *SELECTION],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]  # pytest's "tests failed", passed through
    assert "strict mode: would skip: needs a CUDA device" in out, out[-4000:]
    summary = json.loads((report / "parity" / "summary.json").read_text())
    ids = sorted(c["id"] for c in summary["cases"])
    assert ids == ["liger_vocab_ce-fp32-v32-ign_none-tp2-cuda", "liger_vocab_ce-fp32-v32-ign_none-tp4-cuda"]
    assert summary["counts"]["failed"] == 2 and summary["counts"]["total"] == 2
    assert all("needs a CUDA device" in c["reason"] for c in summary["cases"])
    suite = ET.parse(report / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "2" and suite.get("skipped") == "0"
