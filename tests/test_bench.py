"""`parity bench` on CPU at tiny sizes: the command runs, prints both stages, and reports Liger as not run.

The figures themselves are not checked (a benchmark is not a test); the structure and the
observed-backend bookkeeping are.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_cpu_smoke(tmp_path):
    js, md = tmp_path / "bench.json", tmp_path / "bench.md"
    cmd = [sys.executable, "-m", "parity.cli", "bench", "--device", "cpu", "--repeats", "2", "--warmup", "1",
           "--tokens", "64", "128", "--local-vocab", "256", "--mem-hidden", "16", "--mem-vocab", "512",
           "--mem-tokens", "32", "--timeout", "120", "--json", str(js), "--markdown", str(md)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.index("## Environment") < out.index("## Stage 1") < out.index("## Stage 2")
    for key in ("- torch:", "- triton:", "- cuda:", "- gpu:"):
        assert key in out
    assert "world 1 (size-1 tp_group)" in out and "TP=2" in out
    assert "| 64 | torch | torch x2 |" in out and "| 128 | torch | torch x2 |" in out
    assert "| liger | not run: DeepSpeed's accelerator 'cpu' reports no Triton support" in out

    data = json.loads(js.read_text())
    assert data["environment"]["device"] == "cpu" and data["problems"] == []
    s1 = {(r["tokens"], r["backend"]): r for r in data["stage1"]}
    assert set(s1) == {(64, "torch"), (64, "liger"), (128, "torch"), (128, "liger")}
    for tokens in (64, 128):
        t = s1[tokens, "torch"]
        assert t["status"] == "ran" and t["observed"] == "torch" and t["calls"] == {"liger": 0, "torch": 2}
        assert t["ms_median"] > 0 and t["peak_allocated_bytes"] is None  # no allocator statistics on CPU
        assert s1[tokens, "liger"]["status"].startswith("not run: ")
    s2 = {r["backend"]: r for r in data["stage2"]}
    assert s2["torch"]["status"] == "ran" and s2["torch"]["ranks"] == 2
    assert s2["torch"]["calls_per_rank"] == {"liger": 0, "torch": 10}  # 5 updates x 2 micro-batches
    assert len(s2["torch"]["per_rank"]) == 2 and s2["torch"]["final_loss"] > 0
    assert s2["liger"]["status"].startswith("not run: ")
    text = md.read_text()
    assert "| tokens | backend | ran |" in text and "| backend | ran | peak allocated bytes" in text


def test_bench_stage1_at_tp2_cpu(tmp_path):
    js = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "parity.cli", "bench", "--device", "cpu", "--stages", "1", "--tp", "2",
           "--backends", "torch", "--repeats", "2", "--warmup", "1", "--tokens", "64", "--local-vocab", "128",
           "--timeout", "120", "--json", str(js)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TP=2, cpu ranks over gloo" in proc.stdout and "(global 256)" in proc.stdout
    row = json.loads(js.read_text())["stage1"][0]
    # Both ranks ran DeepSpeed's torch CE on their own shard, once per timed run.
    assert row["calls_per_rank"] == [{"liger": 0, "torch": 2}] * 2
    assert row["ms_median_slowest_rank"] >= row["ms_median"] > 0


def test_liger_requested_but_torch_ran_fails_loudly():
    import torch

    from parity.bench import _Counters

    counters = _Counters()
    try:
        logits = torch.randn(4, 8, requires_grad=True)
        # tp_group=None: DeepSpeed's gate refuses Liger and silently runs the torch path.
        counters.ce(logits, torch.tensor([0, 1, 2, 3]), tp_group=None, backend="liger").backward()
        with pytest.raises(RuntimeError, match="requested for 1 CE calls, but DeepSpeed ran liger 0 and torch 1"):
            counters.check("liger", 1)
        assert counters.check("torch", 1) == {"liger": 0, "torch": 1}
    finally:
        counters.restore()


def test_backend_not_run_on_cuda_is_a_problem():
    from parity.bench import summarize

    cfg = {"device": "cuda", "stages": "1", "tokens": [8], "backends": ["liger"]}
    rows = [{"tokens": 8, "backend": "liger", "status": "not run: liger-kernel is not installed"}]
    summary = summarize(cfg, {}, [{"rank": 0, "stage1": rows}])
    assert summary["problems"] == ["liger not run: liger-kernel is not installed"]
    cfg["device"] = "cpu"
    assert summarize(cfg, {}, [{"rank": 0, "stage1": rows}])["problems"] == []
