"""Megatron-core subjects: what they need from the machine, that a missing or broken megatron-core is a
named skip (and a failure under strict), and that the model-parallel state reset can tell a leak."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.matrix.cases import load
from parity.observe import capabilities
from parity.subjects import SUBJECTS

ROOT = Path(__file__).resolve().parents[2]
REJECTION = "megatron_vocab_parallel-fp32-mean-v35-h32-bias-ign_scattered-gas2-tp2-cpu"
PLAIN_CPU = "ds_vocab_ce-fp32-none-v32-ign_none-tp2-cpu"


def megatron_cases():
    return [c for c in load() if SUBJECTS[c.subject].framework == "megatron"]


def test_every_megatron_case_needs_megatron_core_and_the_gathered_head_cuda_and_a_gpu_per_rank():
    cases = megatron_cases()
    assert len(cases) >= 30
    for c in cases:
        needs = SUBJECTS[c.subject].requires(c.values)
        assert needs[0] == "megatron_core", c.id
        if c.subject == "megatron_column_gathered":
            assert c["device"] == "cuda" and needs == ["megatron_core", "cuda", f"gpus{c['tp']}"], (c.id, needs)
    assert not any("megatron_core" in SUBJECTS[c.subject].requires(c.values)
                   for c in load() if SUBJECTS[c.subject].framework != "megatron")


def test_megatron_core_imports_here_and_a_broken_install_is_named(monkeypatch, tmp_path):
    assert capabilities._megatron_core() is None  # requirements-cpu.txt pins it: it imports on this CPU
    fake = tmp_path / "megatron" / "core"
    fake.mkdir(parents=True)
    (tmp_path / "megatron" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = capabilities._megatron_core()
    assert reason.startswith("megatron_core: importing megatron.core.tensor_parallel fails with megatron-core "), reason
    assert "libcudart.so.12" in reason, reason


def test_without_megatron_core_its_cases_skip_by_name_and_strict_fails_them(tmp_path):
    for strict in (False, True):
        report = tmp_path / f"strict{int(strict)}"
        env = {**os.environ, capabilities.ASSUME_MISSING_VAR: "megatron_core", "PARITY_STRICT": "1" if strict else "0"}
        cmd = [sys.executable, "-m", "parity.cli", "run", "--report", str(report), "--case", REJECTION,
               "--case", PLAIN_CPU]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        cases = {c["id"]: c for c in json.loads((report / "summary.json").read_text())["cases"]}
        assert proc.returncode == int(strict), proc.stdout[-3000:] + proc.stderr[-3000:]
        prefix = "strict mode: would skip: " if strict else ""
        assert cases[REJECTION]["verdict"] == ("failed" if strict else "skipped"), cases[REJECTION]
        assert cases[REJECTION]["reason"].startswith(prefix + "needs megatron_core"), cases[REJECTION]
        assert cases[PLAIN_CPU]["verdict"] == "passed", cases[PLAIN_CPU]


@pytest.fixture
def one_rank_group():
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_reset_tears_down_megatron_state_and_the_snapshot_shows_a_leak(one_rank_group):
    from megatron.core import parallel_state

    from parity.subjects.base import RankContext
    from parity.subjects.megatron_tp import CLEAN_STATE, process_state

    subject = SUBJECTS["megatron_vocab_parallel"]
    assert subject.clean_state == CLEAN_STATE
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, create_gloo_process_groups=False)
    leaked = process_state()
    assert leaked != CLEAN_STATE and leaked["model_parallel_initialized"] is True, leaked
    assert subject.reset_process_state(RankContext(0, 1, "cpu")) == CLEAN_STATE
    assert not parallel_state.model_parallel_is_initialized()
