"""zoo_transformers_tp: its claims shard what the model's plan shards, as transformers' styles document it; it skips
by name without accelerate; the full-zoo file lists every architecture outside the default matrix. Its cases run in
cases/zoo_transformers_tp.toml (CI's zoo_transformers_tp job)."""
import fnmatch
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail

if find_spec("transformers") is None:
    skip_or_fail("transformers is not installed (pip install -e '.[hf]'); requirements-cpu.txt pins it")

from parity.subjects import SUBJECTS  # noqa: E402
from parity.subjects.values import resolve  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NAME = "zoo_transformers_tp"


@pytest.mark.parametrize("arch", ["llama", "cohere"])
def test_claims_shard_what_the_plan_shards(arch):
    """Restated with fnmatch over the model's own _tp_plan: colwise Linear weights on dim 0, rowwise on dim 1, the
    embedding's rows on dim 0; norms whole; a tied head is the embedding's Parameter and claims its placement."""
    import torch

    subject = SUBJECTS[NAME]
    values = resolve(subject, {"arch": arch})
    from references import zoo

    model = zoo.build(arch)
    claims = subject.claims(values)
    plan = {p[len("model."):] if p.startswith("model.") else p: s for p, s in model._tp_plan.items()}
    dims = {"colwise": 0, "colwise_gather_output": 0, "rowwise": 1, "embedding_rowwise": 0}
    for name, module in model.named_modules():
        styles = [s for p, s in plan.items() if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "model." + p)]
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) and f"{name}.weight" in claims.param_shards:
            assert claims.param_shards[f"{name}.weight"] == dims.get(styles[-1] if styles else None), name
            assert claims.module_types[name] == f"{type(module).__name__}(Shard(dim={dims[styles[-1]]}),)", name
    assert claims.param_shards["model.norm.weight"] is None and claims.split == "chunk"
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert claims.shared_params == ((("lm_head.weight", "model.embed_tokens.weight"),) if tied else ())
    assert claims.module_types["lm_head"] == "Linear(Shard(dim=0),)"


def test_skips_by_name_without_accelerate(monkeypatch):
    import parity.subjects.zoo_transformers_tp as module

    real = module.find_spec
    monkeypatch.setattr(module, "find_spec", lambda name: None if name == "accelerate" else real(name))
    subject = SUBJECTS[NAME]
    reason = subject.unavailable_reason(resolve(subject, {"arch": "llama"}))
    assert "accelerate is not installed" in reason and "check_and_set_device_map" in reason


def test_full_file_lists_every_architecture_outside_the_default_matrix():
    from parity.axes import ARCHITECTURES
    from parity.matrix.cases import default_files, load

    full = ROOT / "cases" / "zoo" / "full_transformers_tp.toml"
    assert full not in [f.resolve() for f in default_files()]
    cases = load([full])
    assert sorted(c.values["arch"] for c in cases) == sorted(ARCHITECTURES)
    assert {(c.subject, c.values["dtype"], c.values["tp"]) for c in cases} == {(NAME, "fp32", 2)}


def test_process_state_names_what_a_load_left_replaced():
    """clean in a process that loaded nothing at once; a swap from_pretrained makes (no_tie_weights) reads as dirty."""
    from transformers import initialization as init

    subject = SUBJECTS[NAME]
    assert subject.reset_process_state(None) == subject.clean_state
    with init.no_tie_weights():
        assert subject.reset_process_state(None)["tie_weights"] != subject.clean_state["tie_weights"]
    assert subject.reset_process_state(None) == subject.clean_state
