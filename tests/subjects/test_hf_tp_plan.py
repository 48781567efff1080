"""The hf_tp_plan subjects without rank processes: the plan they hand DeepSpeed, the parameters their
claims declare sharded, and a reference that never imports deepspeed."""
import fnmatch
import subprocess
import sys
from pathlib import Path

from importlib.util import find_spec

import pytest

from tests.conftest import skip_or_fail

if find_spec("transformers") is None:
    skip_or_fail("transformers is not installed (pip install -e '.[hf]'); requirements-cpu.txt pins it")

from parity.subjects import SUBJECTS  # noqa: E402
from parity.subjects.values import resolve  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE = {"dtype": "fp32", "reduction": "mean", "vocab": 33, "ignore": "scattered", "zero": 0, "gas": 2, "tp": 2,
        "device": "cpu"}
STYLE_DIM = {"colwise": 0, "colwise_rep": 0, "colwise_gather_output": 0, "rowwise": 1}


def plan_of(model):
    """The merge DeepSpeed's _get_hf_tp_plan does (config base plan, class plan, instance plan), restated."""
    merged = {}
    for plan in (model.config.base_model_tp_plan, type(model)._tp_plan, model.__dict__.get("_tp_plan")):
        for pattern, style in (plan or {}).items():
            merged[pattern[len("model."):] if pattern.startswith("model.") else pattern] = style
    return merged


@pytest.mark.parametrize("name,extra,head_style", [
    ("hf_plan_column", {"hf_head": "colwise_gather_output"}, "colwise_gather_output"),
    ("hf_plan_column", {"hf_head": "colwise_rep"}, "colwise_rep"),
    ("hf_plan_row", {}, "rowwise"),
    ("hf_plan_tied", {"vocab_parallel_lm_head": "false"}, "colwise_gather_output"),
])
def test_claims_declare_every_parameter_the_plan_shards(name, extra, head_style):
    subject = SUBJECTS[name]
    values = resolve(subject, {**BASE, **extra})
    model = subject.build(values, __import__("torch").float32)
    plan = plan_of(model)
    assert plan["lm_head"] == head_style
    assert "partition_config" not in subject.tensor_parallel_config(values)  # else the plan is ignored
    claims = subject.claims(values)
    names = [n for n, _ in model.named_parameters()]
    assert set(claims.param_shards) <= set(names)
    for param in names:
        module = param.rsplit(".", 1)[0]
        styles = [s for p, s in plan.items() if fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, "model." + p)]
        want = STYLE_DIM.get(styles[-1]) if styles else None
        if name == "hf_plan_tied" and module == "lm_head":
            continue  # tied: one Parameter, named model.embed_tokens.weight
        if name == "hf_plan_tied" and claims.param_shards.get(param) is None and module == "model.embed_tokens":
            continue
        assert claims.param_shards.get(param) == want, (param, styles)


def test_tied_vocab_parallel_settings():
    subject = SUBJECTS["hf_plan_tied"]
    for setting, config, vocab_parallel in (("true", {"vocab_parallel_lm_head": True}, True),
                                            ("false", {"vocab_parallel_lm_head": False}, False),
                                            ("unset", {}, True)):
        values = resolve(subject, {**BASE, "vocab_parallel_lm_head": setting})
        assert subject.tensor_parallel_config(values) == config
        claims = subject.claims(values)
        assert claims.shared_params == (("lm_head.weight", "model.embed_tokens.weight"),)
        assert (claims.module_types["lm_head"] == "VocabParallelLinear") is vocab_parallel
        assert claims.param_shards["model.embed_tokens.weight"] == (0 if vocab_parallel else None)
        model = subject.build(values, __import__("torch").float32)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert plan_of(model)["embed_tokens"] == "embedding_rowwise"


def test_reference_runs_without_deepspeed():
    code = ("import sys; from parity.subjects import SUBJECTS; from parity.subjects.values import resolve; import torch;"
            "v = resolve(SUBJECTS['hf_plan_tied'], {'dtype': 'bf16', 'reduction': 'num_items', 'vocab': 33,"
            " 'ignore': 'scattered', 'zero': 0, 'gas': 2, 'tp': 2, 'device': 'cpu', 'vocab_parallel_lm_head': 'unset'});"
            "t = SUBJECTS['hf_plan_tied'].reference(v, torch.float64);"
            "assert ('grad', 4, None, None, 'model.embed_tokens.weight') in t.records;"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('deepspeed', 'liger_kernel')], 'imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)
