"""parity run --profile and --passes, end to end on one real case run twice in one process: the
phases of every case add up to its wall time, the reference's time shows (computed once, then
shared), the report writer's parts are timed, and each pass prints the parent's and both ranks' RSS."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from parity.harness.timing import PHASES, close_case, pool_phases

ROOT = Path(__file__).resolve().parents[2]
CASE = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"


def test_pool_phases_split_a_case_by_the_ranks_stamps():
    # sent at 10; rank 0 took it at 10.5 and worked 2 s; rank 1 took it at 11 and worked 1 s;
    # the parent had rank 0's result at 12.75 (the last), rank 1's at 12.25, and returned at 12.8.
    stamps = {0: ({"received": 10.5, "done": 12.5}, 12.75), 1: ({"received": 11.0, "done": 12.0}, 12.25)}
    t = pool_phases(0.3, 10.0, stamps, 12.8)
    assert t["rank_start"] == 0.3 and t["rank_work"] == 2.0  # rank 0's: its result came last
    assert abs(t["ipc"] - (0.5 + 0.25)) < 1e-9 and abs(t["waiting"] - 0.05) < 1e-9
    assert abs(t["ipc"] + t["rank_work"] + t["waiting"] - 2.8) < 1e-9
    case = close_case({**t, "reference": 0.5, "comparison": 0.1}, 4.0)
    assert abs(sum(case[p] for p in PHASES) - 4.0) < 1e-6 and case["other"] > 0
    # a rank lost to a hang sent nothing: the whole wait is waiting, never rank work
    assert pool_phases(0.0, 10.0, {}, 70.0) == {"rank_start": 0.0, "waiting": 60.0}


def prof_base() -> dict:
    return {"cases": 0, "jobs": 2, "wall_seconds": 12.0, "totals": {c: 0.0 for c in ("wall", "reference_compute",
            *PHASES)}, "by_subject": {}, "report": {}}


def test_occupancy_says_how_busy_the_jobs_and_ranks_were():
    from parity.harness.timing import occupancy
    from parity.report.profile import profile_markdown

    # Jobs made at 100; probes done at 104; job 0 ran a 2-rank batch 104-110 and a 3-rank one 110-112;
    # job 1 a 2-rank batch 105-106, then sat idle: 12 s from creation to the last answer.
    spans = [(0, 2, 5, 104.0, 110.0), (1, 2, 1, 105.0, 106.0), (0, 3, 2, 110.0, 112.0)]
    got = occupancy(spans, {"created": 100.0, "probed": 104.0}, jobs=2, cores=4)
    assert got["probing_s"] == 4.0 and got["first_batch_sent_s"] == 4.0 and got["last_answer_s"] == 12.0
    assert got["jobs_busy_mean"] == round((6 + 1 + 2) / 12, 2)
    assert got["ranks_busy_mean"] == round((2 * 6 + 2 * 1 + 3 * 2) / 12, 2)
    assert got["last_batch_s"] == 2.0 and got["largest_batches"][0] == [6.0, 5, 2, "", 4.0]
    named = occupancy([(0, 2, 5, 104.0, 110.0, "vocab_parallel")], {"created": 100.0}, jobs=1, cores=4)
    assert named["largest_batches"][0] == [6.0, 5, 2, "vocab_parallel", 4.0]
    assert "(vocab_parallel, sent at 4.0 s)" in profile_markdown({**prof_base(), "occupancy": named})
    assert occupancy([], {"created": 0.0}, 2, 4) == {}
    prof = {**prof_base(), "occupancy": got}
    assert "capabilities probed at 4.0 s" in profile_markdown(prof)


def test_profile_and_passes_on_a_real_case(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "parity.cli", "run", "--case", CASE, "--passes", "2", "-j", "1",
                           "--profile", "--report", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    passes = re.findall(r"^pass (\d): .* RSS MiB parent (\d+); ranks w2-cpu \[(\d+), (\d+)\]$", proc.stdout, re.M)
    assert [p[0] for p in passes] == ["1", "2"], proc.stdout
    assert all(int(v) > 50 for p in passes for v in p[1:]), passes  # resident processes, not placeholders
    prof = json.loads((tmp_path / "profile.json").read_text())
    (case,) = prof["per_case"]  # the last pass's
    assert case["id"] == CASE and case["verdict"] == "passed"
    assert abs(sum(case[p] for p in PHASES) - case["wall"]) < 1e-3
    assert case["rank_work"] > 0 and case["comparison"] > 0
    assert case["rank_start"] == 0  # the second pass reuses the first pass's ranks
    assert case["reference_compute"] < 0.05  # the first pass computed the reference, the second reused it
    assert prof["reference_cache"]["hits"] >= 1
    assert set(prof["report"]) >= {"summary.json", "results.jsonl", "report.html", "environment"}
    assert "| rank_work |" in (tmp_path / "profile.md").read_text()
