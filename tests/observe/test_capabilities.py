"""What the machine can do decides what runs: a case that needs a missing capability is a skip that
names it, a failure under strict mode, and never a failure of the subject. The CPU without oneDNN
fp16 is simulated (PARITY_ASSUME_MISSING), so this holds on CPUs with and without it."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.observe import capabilities
from parity.matrix.cases import load
from parity.subjects import SUBJECTS

ROOT = Path(__file__).resolve().parents[2]
ENGINE_FP16 = "column_gathered-fp16-sum-v269-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
INFERENCE_FP16 = "inference_head-fp16-v34-h32-untied-bias-lm_head-tp2-grain64-cpu"
DIRECT_FP16 = "ds_vocab_ce-fp16-none-v32-ign_none-tp2-cpu"  # no engine: fp16 tensors run on any CPU


def test_engine_cases_on_cpu_in_fp16_need_cpu_fp16_and_nothing_else_does():
    needing = {c.id for c in load() if "cpu_fp16" in SUBJECTS[c.subject].requires(c.values)}
    assert {ENGINE_FP16, INFERENCE_FP16} <= needing and DIRECT_FP16 not in needing
    for c in load():
        if c.id in needing:
            assert c["dtype"] == "fp16" and c.values.optional("device", "cpu") == "cpu", c.id


def test_simulated_missing_capability_is_named(monkeypatch):
    monkeypatch.setenv(capabilities.ASSUME_MISSING_VAR, "cpu_fp16")
    reason = capabilities.unavailable_reason(["cpu_fp16"])
    assert reason.startswith("needs cpu_fp16") and capabilities.ASSUME_MISSING_VAR in reason
    monkeypatch.setenv(capabilities.ASSUME_MISSING_VAR, "warp_drive")
    with pytest.raises(ValueError, match="unknown capability 'warp_drive'"):
        capabilities.missing("cpu_fp16")


def test_the_probe_asks_torch_not_the_subject(monkeypatch):
    import torch

    monkeypatch.delenv(capabilities.ASSUME_MISSING_VAR, raising=False)
    expected = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    assert (capabilities.missing("cpu_fp16") is None) == expected
    tree = ast.parse(Path(capabilities.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"deepspeed", "liger_kernel", "megatron", "parity"}, imported  # nothing under test


def _run(tmp_path, strict: bool):
    report = tmp_path / ("strict" if strict else "plain")
    env = {**os.environ, capabilities.ASSUME_MISSING_VAR: "cpu_fp16", "PARITY_STRICT": "1" if strict else "0"}
    cmd = [sys.executable, "-m", "parity.cli", "run", "--case", ENGINE_FP16, "--case", INFERENCE_FP16,
           "--case", DIRECT_FP16, "--report", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    summary = json.loads((report / "summary.json").read_text())
    return proc, {c["id"]: c for c in summary["cases"]}


def test_a_cpu_without_fp16_skips_engine_fp16_cases_by_name_and_strict_fails_them(tmp_path):
    proc, cases = _run(tmp_path, strict=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for case_id in (ENGINE_FP16, INFERENCE_FP16):
        assert cases[case_id]["verdict"] == "skipped", cases[case_id]
        assert cases[case_id]["reason"].startswith("needs cpu_fp16"), cases[case_id]["reason"]
    assert cases[DIRECT_FP16]["verdict"] == "passed", cases[DIRECT_FP16]

    proc, cases = _run(tmp_path, strict=True)
    assert proc.returncode == 1
    for case_id in (ENGINE_FP16, INFERENCE_FP16):
        assert cases[case_id]["verdict"] == "failed"
        assert cases[case_id]["reason"].startswith("strict mode: would skip: needs cpu_fp16")
    assert cases[DIRECT_FP16]["verdict"] == "passed"


LIGER_CPU = ("liger_vocab_ce-fp32-v32-ign_scattered-tp2-cpu", "ds_liger_ce-fp32-v32-ign_none-tp2-cpu")
PLAIN_CPU = "ds_vocab_ce-fp32-none-v32-ign_none-tp2-cpu"  # DeepSpeed's torch CE: no Triton anywhere


def test_every_liger_case_on_cpu_needs_the_interpreter_and_nothing_else_does():
    needing = {c.id for c in load() if "triton_interpreter" in SUBJECTS[c.subject].requires(c.values)}
    # The Liger subjects on CPU, and DeepSpeed AutoTP cases that claim Triton for its Liger backend.
    liger_cpu = {c.id for c in load() if c.values.optional("device", "cpu") == "cpu"
                 and (c.subject in ("liger_vocab_ce", "ds_liger_ce")
                      or (c.values.optional("triton", None) == "claimed" and c.values.optional("backend", None) == "liger"))}
    assert set(LIGER_CPU) <= needing and len(needing) >= 30 and PLAIN_CPU not in needing
    assert needing == liger_cpu


def test_the_interpreter_probe_runs_a_kernel_of_its_own_and_can_fail(monkeypatch, tmp_path):
    probe = Path(capabilities.__file__).with_name("triton_probe.py")
    tree = ast.parse(probe.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported & {"deepspeed", "liger_kernel", "parity"} == set(), imported
    assert capabilities._triton_interpreter() is None  # this machine's triton/numpy pair works
    # A triton whose interpreter breaks as Triton 3.6's does under numpy >= 2.4: first on the path.
    fake = tmp_path / "triton"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise RuntimeError(\"InterpreterError: TypeError('only 0-dimensional arrays can be converted')\")\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    reason = capabilities._triton_interpreter()
    assert reason.startswith("triton_interpreter: Triton's interpreter fails"), reason
    assert "only 0-dimensional arrays" in reason and "numpy " in reason, reason


def test_a_broken_interpreter_skips_liger_cpu_cases_by_name_and_strict_fails_them(tmp_path):
    for strict in (False, True):
        report = tmp_path / f"strict{int(strict)}"
        env = {**os.environ, capabilities.ASSUME_MISSING_VAR: "triton_interpreter",
               "PARITY_STRICT": "1" if strict else "0"}
        cmd = [sys.executable, "-m", "parity.cli", "run", "--report", str(report), "--case", PLAIN_CPU]
        cmd += [arg for case_id in LIGER_CPU for arg in ("--case", case_id)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        summary = json.loads((report / "summary.json").read_text())
        cases = {c["id"]: c for c in summary["cases"]}
        assert proc.returncode == int(strict), proc.stdout[-3000:] + proc.stderr[-3000:]
        for case_id in LIGER_CPU:
            prefix = "strict mode: would skip: " if strict else ""
            assert cases[case_id]["verdict"] == ("failed" if strict else "skipped"), cases[case_id]
            assert cases[case_id]["reason"].startswith(prefix + "needs triton_interpreter"), cases[case_id]
        assert cases[PLAIN_CPU]["verdict"] == "passed", cases[PLAIN_CPU]
