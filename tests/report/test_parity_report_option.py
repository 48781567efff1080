"""pytest --parity-report DIR: bad input is a usage error naming what is allowed. (That the report
gathers the verdicts of every xdist worker is shown by tests/test_modal_runner.py's local run.)"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_file_is_not_a_report_directory(tmp_path):
    target = tmp_path / "a_file"
    target.write_text("")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--parity-report", str(target), "--collect-only", "-q",
                           "tests/observe/test_partition.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert f"--parity-report {target}: exists and is not a directory" in proc.stderr
    assert "allowed: a directory, created if missing" in proc.stderr


def test_report_gets_every_check_and_junit_only_the_compact_verdict(tmp_path):
    import json
    import xml.etree.ElementTree as ET

    ids = ["ds_vocab_ce-fp32-none-v32-ign_none-tp2-cpu", "ds_vocab_ce-fp32-none-v32-ign_scattered-tp2-cpu"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2",
                           f"--junitxml={tmp_path / 'junit.xml'}", "--parity-report", str(tmp_path / "parity"),
                           "-k", f"({' or '.join(ids)}) and not gvs_", "cases/deepspeed_ce.toml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "parity" / "summary.json").read_text())
    assert sorted(c["id"] for c in summary["cases"]) == ids  # both xdist workers' verdicts arrived
    lines = [json.loads(line) for line in (tmp_path / "parity" / "results.jsonl").read_text().splitlines()]
    assert {line["case"] for line in lines} == set(ids) and all(line["check"] for line in lines)
    assert sum(line["checks"] for line in lines) == sum(c["checks"] for c in summary["cases"])
    junit = (tmp_path / "junit.xml").read_text()
    props = [p.get("name") for p in ET.fromstring(junit).iter("property")]
    assert props.count("verdict") == 2 and "parity_record" not in props and "check_results" not in junit
