"""A DeepSpeed change under test, as the README's "Testing a DeepSpeed change" does it: a baseline
report, then the same cases against a locally patched copy of deepspeed put first on PYTHONPATH (as
an editable checkout would be), then `parity diff`. The patch scales DeepSpeed's vocabulary-parallel
CE loss by 1.01: the diff must report the verdicts that changed and where deepspeed came from."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from parity.report.environment import package

ROOT = Path(__file__).resolve().parents[2]
CASES = ("ds_vocab_ce-fp32-none-v32-ign_none-tp2-cpu", "ds_vocab_ce-fp32-sum-v35-ign_scattered-tp2-cpu",
         "ds_vocab_ce-fp32-mean-v32-ign_scattered-tp2-cpu")
CORRECT = "        loss = torch.log(global_sum_exp) + global_max - target_logits\n"
SCALED = "        loss = 1.01 * (torch.log(global_sum_exp) + global_max - target_logits)\n"


def _parity(*args, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "parity.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _run(report, env=None):
    cases = [arg for case_id in CASES for arg in ("--case", case_id)]
    return _parity("run", "--report", str(report), *cases, env=env)


def test_a_patched_deepspeed_on_pythonpath_shows_in_the_diff(tmp_path):
    installed = Path(package("deepspeed", "deepspeed")["path"])
    checkout = tmp_path / "DeepSpeed"
    shutil.copytree(installed, checkout / "deepspeed", ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    ce = checkout / "deepspeed" / "sequence" / "cross_entropy.py"
    source = ce.read_text()
    assert source.count(CORRECT) == 1, "DeepSpeed's CE changed: update the line this test patches"
    ce.write_text(source.replace(CORRECT, SCALED))

    base = _run(tmp_path / "base")
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]
    patched = _run(tmp_path / "patched", env={"PYTHONPATH": os.pathsep.join(
        p for p in (str(checkout), os.environ.get("PYTHONPATH")) if p)})
    assert patched.returncode == 1, patched.stdout[-3000:] + patched.stderr[-3000:]

    summary = json.loads((tmp_path / "patched" / "summary.json").read_text())
    assert summary["schema_version"] >= 2
    assert summary["packages"]["deepspeed"]["path"] == str((checkout / "deepspeed").resolve())
    assert summary["packages"]["deepspeed"]["from_installed_distribution"] is False
    assert {c["id"]: c["verdict"] for c in summary["cases"]} == dict.fromkeys(CASES, "failed")

    diff = _parity("diff", str(tmp_path / "base"), str(tmp_path / "patched"))
    assert diff.returncode == 1, diff.stdout + diff.stderr
    out = diff.stdout
    assert "tested different versions (1):" in out, out
    assert f"deepspeed: imported from {installed.resolve()} -> {(checkout / 'deepspeed').resolve()}" in out, out
    assert "verdict changed (3):" in out and out.count("WORSE") == 3, out
    assert "3 got worse" in out
    same = _parity("diff", str(tmp_path / "base"), str(tmp_path / "base"))
    assert "tested different versions" not in same.stdout and same.returncode == 0, same.stdout
