"""The harness can fail: broken subjects fail, dead or stuck ranks fail in bounded time, and the
run goes on. Each test spends real rank processes, so they share one Runner."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parity.matrix.cases import load_file
from parity.harness.runner import Runner
from parity.checks.verdict import DIVERGED, FAILED, PASSED, XPASSED

FAULTY = Path(__file__).resolve().parents[1] / "cases" / "faulty.toml"
ROOT = FAULTY.parent.parent.parent
GOOD_ID = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"


@pytest.fixture(scope="module")
def runner():
    r = Runner(timeout_s=20)
    yield r
    r.close()


@pytest.fixture(scope="module")
def cases():
    return {c.subject + (f"/{c.expect.match}" if c.expect.is_error else "") +
            (f"/v{c['vocab']}" if c.divergence else ""): c for c in load_file(FAULTY)}


def good_case():
    from parity.matrix.cases import load

    return next(c for c in load() if c.id == GOOD_ID)


def test_a_correct_case_passes(runner):
    verdict = runner.run(good_case())
    assert verdict.status == PASSED, verdict.explain()
    names = {c.name.split("[")[0] for c in verdict.checks}
    assert {"logits", "loss", "head_input_grad", "grad", "weight", "sgd_update", "weight_changed", "module_type",
            "initial_weight", "replicas_agree", "process_state_reset"} <= names


def test_dropped_gradient_allreduce_is_caught(runner, cases):
    verdict = runner.run(cases["faulty_dropped_allreduce"])
    assert verdict.status == FAILED
    failed = {c.name.split("[")[0] for c in verdict.failed_checks}
    assert "head_input_grad" in failed, verdict.explain()
    first = verdict.failed_checks[0].describe()
    assert "measured" in first and "bound" in first and "margin" in first and "rank=" in first


def test_head_left_replicated_fails_its_claim(runner, cases):
    verdict = runner.run(cases["faulty_unsharded_head"])
    assert verdict.status == FAILED
    assert any(c.name == "module_type[lm_head]" for c in verdict.failed_checks), verdict.explain()


def test_a_rank_that_raises_while_its_peer_waits(runner, cases):
    start = time.monotonic()
    verdict = runner.run(cases["faulty_raises_on_rank1"])
    assert verdict.status == FAILED
    assert "planted failure on rank 1" in verdict.rank_errors[1].traceback
    assert verdict.reason.startswith("rank 1 raised"), verdict.reason  # the cause, not the peer it left waiting
    lost = verdict.rank_errors[0]
    assert lost.type == "RankLost"  # stuck in initialize's collectives, then released and torn down
    # released by stopping rank 1, not waited out for the whole grace: the collective's stack is kept
    assert "released when the parent stopped them" in lost.message, lost.message
    assert "Connection closed by peer" in lost.traceback and "distributed_c10d" in lost.traceback
    assert time.monotonic() - start < 60
    assert runner.run(good_case()).status == PASSED  # the run goes on with a fresh rank group


def test_a_hung_rank_fails_with_its_stack(runner, cases):
    start = time.monotonic()
    verdict = runner.run(cases["faulty_hangs_on_rank0"])
    assert verdict.status == FAILED
    assert "no result within" in verdict.rank_errors[0].message
    assert "planted_hang" in verdict.rank_errors[0].traceback  # faulthandler's dump of the stuck rank
    assert time.monotonic() - start < 60


def test_a_dead_rank_fails_the_case(runner, cases):
    verdict = runner.run(cases["faulty_dies_on_rank1"])
    assert verdict.status == FAILED
    assert "died (exit code 3)" in verdict.rank_errors[1].message
    assert runner.run(good_case()).status == PASSED


def test_a_rank_aborted_by_a_collective_mismatch_is_the_cause(runner, cases):
    """A rank that dies is a cause, with what killed it read from its log; the peer whose collective it closed is
    only lost to it, and the reason names the dead rank."""
    verdict = runner.run(cases["faulty_aborts_on_rank1"])
    assert verdict.status == FAILED
    dead, lost = verdict.rank_errors[1], verdict.rank_errors[0]
    assert dead.type == "RankDied" and dead.message.startswith("died (exit code -6) after gloo::EnforceNotMet: ")
    assert "collective mismatch" in dead.message
    assert lost.type == "RankLost" and "rank(s) 1 died" in lost.message, lost.message
    assert verdict.reason.startswith("rank 1 raised RankDied: died (exit code -6)"), verdict.reason


def test_state_left_behind_is_reset_before_the_next_case(runner, cases):
    assert runner.run(cases["faulty_leaves_state"]).status == PASSED
    verdict = runner.run(good_case())
    assert verdict.status == PASSED, verdict.explain()
    resets = [c for c in verdict.checks if c.name == "process_state_reset"]
    assert len(resets) == 2 and all(c.passed for c in resets)


def test_expected_rejection_passes_and_wrong_message_fails(runner, cases):
    assert runner.run(cases["faulty_always_rejects/planted rejection"]).status == PASSED
    verdict = runner.run(cases["faulty_always_rejects/a message it never says"])
    assert verdict.status == FAILED and "expected ValueError" in verdict.reason


def test_a_rejection_must_leave_the_model_as_it_was(runner, cases):
    # Item 4 of issue 13: after the expected error, what the user holds is checked; a model changed
    # (half-converted) or a process switch flipped on one rank fails, and so does an unrecorded aftermath.
    clean = runner.run(cases["faulty_rejects_none/planted rejection"])
    assert clean.status == PASSED and "untouched" in clean.reason
    for plant, check in (("convert", "state_after_rejection"), ("switch", "process_state_after_rejection")):
        verdict = runner.run(cases[f"faulty_rejects_{plant}/planted rejection"])
        failed = {(c.name, c.rank) for c in verdict.failed_checks}
        assert verdict.status == FAILED and failed == {(check, 1)}, (plant, verdict.reason)
    converted = runner.run(cases["faulty_rejects_convert/planted rejection"])
    assert "param[lm_head.weight]" in converted.reason  # the verdict names what changed
    unrecorded = runner.run(cases["faulty_rejects_unrecorded/planted rejection"])
    assert unrecorded.status == FAILED and "recorded no state" in unrecorded.reason


def test_cli_run_reports_and_exits_nonzero(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "parity.cli", "run", "--matrix", str(FAULTY),
                           "-k", "(dropped_allreduce and v35) or always_rejects", "--report", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "parity run --matrix" in proc.stdout and "--case faulty_dropped_allreduce" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["counts"] == {"total": 3, "passed": 1, "failed": 2, "skipped": 0, "diverged": 0, "xpassed": 0}
    entry = next(c for c in summary["cases"] if c["subject"] == "faulty_dropped_allreduce")
    assert entry["verdict"] == "failed" and entry["first_failure"] and entry["axes"]["vocab"] == 35
    assert entry["seconds"] > 0


def test_cli_list_json_matches_the_loader():
    proc = subprocess.run([sys.executable, "-m", "parity.cli", "list", "--json", "-k", "vocab_parallel and v269"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    listed = json.loads(proc.stdout)
    assert listed and all("v269" in c["id"] and c["subject"] == "vocab_parallel" for c in listed)


def test_known_divergence_reproduced_beyond_and_fixed(runner, cases):
    assert runner.run(cases["faulty_dropped_allreduce/v36"]).status == DIVERGED
    beyond = runner.run(cases["faulty_dropped_allreduce/v37"])
    assert beyond.status == FAILED and "beyond its known divergence" in beyond.reason
    fixed = runner.run(cases["column_gathered/v33"])
    assert fixed.status == XPASSED and "no longer reproduces" in fixed.reason
