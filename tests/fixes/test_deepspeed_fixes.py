"""Fixes the suite proves (fixes/deepspeed/): each patch, applied to a copy of the installed DeepSpeed put first on
PYTHONPATH, makes its finding's reproducers exit 0 and reads that finding fixed on every case marked with it, and
moves no other verdict of a fixed regression selection; the wrong fix kept beside them is rejected."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXES = sorted((ROOT / "fixes" / "deepspeed").glob("*.patch"))
WRONG = sorted((ROOT / "fixes" / "deepspeed" / "wrong").glob("*.patch"))
PARTIAL = sorted((ROOT / "fixes" / "deepspeed" / "partial").glob("*.patch"))


def test_every_fix_names_its_finding_and_the_version_it_patches():
    assert len(FIXES) >= 5 and WRONG
    for patch in FIXES + WRONG + PARTIAL:
        head = patch.read_text().splitlines()[:3]
        assert head[0].startswith("Finding: ") and head[1].startswith("Fix") and head[2] == "DeepSpeed: 0.19.8", patch


@pytest.mark.slow
def test_the_right_fixes_are_accepted_and_the_wrong_one_rejected(tmp_path):
    out = tmp_path / "outcomes.json"
    done = subprocess.run([sys.executable, "ci/try_fix.py", *map(str, FIXES), "--rejected", *map(str, WRONG + PARTIAL),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    outcomes = json.loads(out.read_text())
    assert [o["accepted"] for o in outcomes.values()] == [True] * len(FIXES) + [False] * len(WRONG + PARTIAL), outcomes
    # The wrong fix fixes its reproducer's numbers and breaks a configuration the reproducer never uses.
    wrong = outcomes[str(WRONG[0])]["problems"]
    assert wrong and not any(p.startswith("ci/repro/") for p in wrong), wrong
    # The partial fix leaves its root cause present on the cases of the symptoms it does not touch.
    assert any("still present" in p for p in outcomes[str(PARTIAL[0])]["problems"])


def test_findings_check_reads_present_on_the_release_and_fixed_on_a_patched_copy(tmp_path):
    """`parity findings --check` on the installed DeepSpeed: the finding present (exit 0); on a copy with its fix
    first on PYTHONPATH: fixed (exit 1, the registry no longer holds for this DeepSpeed)."""
    import os
    import shutil

    import deepspeed

    finding = "deepspeed_zero_init_dtype_ignored"
    command = [sys.executable, "-m", "parity.cli", "findings", "--check", finding, "--json"]
    released = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert released.returncode == 0, released.stdout + released.stderr
    assert json.loads(released.stdout)[0]["status"] == "present"
    shutil.copytree(Path(deepspeed.__file__).parent, tmp_path / "deepspeed",
                    ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    patch = ROOT / "fixes" / "deepspeed" / "zero_init_dtype_ignored.patch"
    subprocess.run(["git", "apply", "-p1", str(patch)], cwd=tmp_path, check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    patched = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert patched.returncode == 1, patched.stdout + patched.stderr
    found = json.loads(patched.stdout)[0]
    assert found["status"] == "fixed" and set(found["reproducers"].values()) == {"fixed"}, found
