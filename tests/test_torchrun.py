"""The torchrun launcher (parity/torchrun_launch.py) gives the self-spawn path's verdicts, a failing
verdict included, lists cases of another world size instead of dropping them, and turns a broken
process group into a failed case, a partial report and a nonzero exit within bounded time."""
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAULTY = "tests/cases/faulty.toml"
MATRICES = ["--matrix", "cases/deepspeed_heads.toml", "--matrix", "cases/deepspeed_ce.toml", "--matrix", FAULTY]
GOOD = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
WORLD2 = [GOOD,
          "vocab_parallel-torch-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",
          "ds_vocab_ce-fp32-none-v35-ign_none-tp2-cpu",
          "faulty_dropped_allreduce-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",  # must fail
          "faulty_always_rejects-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"]
WORLD3 = "ds_vocab_ce-fp32-none-v32-ign_none-tp3-cpu"
RAISES_ON_RANK1 = "faulty_raises_on_rank1-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"


def torchrun(*args, timeout=420):
    # `python -m torch.distributed.run` is torchrun from whichever venv runs the tests.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "parity.cli", "run", "--launcher", "torchrun", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def case_args(ids):
    return [arg for i in ids for arg in ("--case", i)]


def verdicts(report_dir: Path) -> dict:
    return {c["id"]: c["verdict"] for c in json.loads((report_dir / "summary.json").read_text())["cases"]}


def test_torchrun_verdicts_equal_the_self_spawn_path(tmp_path):
    launched = torchrun(*MATRICES, *case_args(WORLD2 + [WORLD3]), "--report", str(tmp_path / "torchrun"))
    spawned = subprocess.run([sys.executable, "-m", "parity.cli", "run", *MATRICES, *case_args(WORLD2),
                              "--report", str(tmp_path / "spawn")], cwd=ROOT, capture_output=True, text=True,
                             timeout=420)
    assert launched.returncode != 0 and spawned.returncode == 1, launched.stdout + launched.stderr
    by_torchrun, by_spawn = verdicts(tmp_path / "torchrun"), verdicts(tmp_path / "spawn")
    assert by_torchrun == by_spawn, launched.stdout
    assert by_torchrun[WORLD2[3]] == "failed" and by_torchrun[GOOD] == "passed"
    assert "faulty_dropped_allreduce" in launched.stdout and "head_input_grad" in launched.stdout
    summary = json.loads((tmp_path / "torchrun" / "summary.json").read_text())
    assert summary["launcher"] == "torchrun"
    assert summary["not_run"] == [{"id": WORLD3, "reason": "needs world 3 (this launch has 2 ranks): launch 3 "
                                   "processes in all, e.g. torchrun --nproc-per-node 3"}]
    assert "1 not run" in launched.stdout


def test_a_rank_stuck_after_its_peer_raised_ends_the_launch_with_a_partial_report(tmp_path):
    start = time.monotonic()
    proc = torchrun(*MATRICES, *case_args([RAISES_ON_RANK1, GOOD]), "--timeout", "60", "--report", str(tmp_path))
    assert time.monotonic() - start < 120
    assert proc.returncode != 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert verdicts(tmp_path) == {RAISES_ON_RANK1: "failed"}
    errors = summary["cases"][0]["rank_errors"]
    assert errors["1"]["message"] == "planted failure on rank 1"
    assert errors["0"]["type"] == "RankLost" and "after a peer failed" in errors["0"]["message"]
    assert "planted failure on rank 1" in proc.stdout  # rank 1's traceback, printed by rank 0
    assert [c["id"] for c in summary["not_run"]] == [GOOD]
    assert "torchrun cannot replace a rank" in summary["not_run"][0]["reason"]
