"""The zoo subjects: the arch axis is the installed transformers' causal-LM mapping, the claims name every parameter
the model's plan shards, cases/zoo.toml lists its cases, and two of them run (one trained, one refused)."""
import fnmatch
import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail

if find_spec("transformers") is None:
    skip_or_fail("transformers is not installed (pip install -e '.[hf]'); requirements-cpu.txt pins it")

from parity.axes import AXES  # noqa: E402
from parity.subjects import SUBJECTS  # noqa: E402
from parity.subjects.values import resolve  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STYLE_DIM = {"colwise": 0, "colwise_rep": 0, "colwise_gather_output": 0, "rowwise": 1}
RUN = ("zoo_hf_plan-arch_llama-v125-fp32-zero0-gas2-tp2-cpu", "zoo_hf_plan-arch_mixtral-v125-fp32-zero0-gas2-tp2-cpu")


def parity(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "parity.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          **kwargs)


def test_arch_axis_is_the_installed_mapping():
    from references.zoo import architectures

    assert AXES["arch"].values == tuple(t for t, _ in architectures())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "codegen"])
def test_claims_shard_what_the_plan_shards(arch):
    """Every Linear parameter a colwise/rowwise plan entry names is claimed on that style's dim (the fnmatch
    restatement of the plan's patterns, independent of the subject's regex)."""
    import torch

    subject = SUBJECTS["zoo_hf_plan"]
    values = resolve(subject, {"arch": arch})
    model = subject.build(values, torch.float32)
    claims = subject.claims(values)
    plan = {p[len("model."):] if p.startswith("model.") else p: s for p, s in model._tp_plan.items()}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == "lm_head":
            continue
        styles = [s for p, s in plan.items() if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "model." + p)]
        assert claims.param_shards.get(f"{name}.weight") == (STYLE_DIM.get(styles[-1]) if styles else None), name
    assert claims.module_types["lm_head"] == "LinearLayer" and claims.param_shards["lm_head.weight"] == 0


def test_census_failures_are_skipped_by_name():
    subject = SUBJECTS["zoo_hf_plan"]
    assert subject.invalid(resolve(subject, {"arch": "dbrx"})) is None
    assert "dbrx cannot be built here" in subject.unavailable_reason(resolve(subject, {"arch": "dbrx"}))
    assert "rope_theta" in subject.unavailable_reason(resolve(subject, {"arch": "dbrx"}))
    assert subject.invalid(resolve(subject, {"arch": "gemma3n"})) is None
    assert "timm" in subject.unavailable_reason(resolve(subject, {"arch": "gemma3n"}))


def test_zoo_cases_list_and_two_run(tmp_path):
    listed = parity("list", "--matrix", "cases/zoo.toml")
    assert listed.returncode == 0, listed.stderr
    ids = listed.stdout.split()
    assert set(RUN) <= set(ids) and len(ids) >= 20
    args = [a for case in RUN for a in ("--case", case)]
    ran = parity("run", "--matrix", "cases/zoo.toml", *args, "--report", str(tmp_path), timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    verdicts = {r["case"]: r["verdict"] for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())
                if "case" in r and "verdict" in r}
    assert verdicts == {RUN[0]: "passed", RUN[1]: "passed"}, verdicts


def test_full_zoo_file_lists_every_architecture_through_both_paths_outside_the_default_matrix():
    from parity.axes import ARCHITECTURES
    from parity.matrix.cases import default_files, load

    full = ROOT / "cases" / "zoo" / "full.toml"
    assert full not in [f.resolve() for f in default_files()]
    cases = load([full])
    for subject in ("zoo_hf_plan", "zoo_vocab_parallel"):
        assert sorted(c.values["arch"] for c in cases if c.subject == subject) == sorted(ARCHITECTURES), subject
    assert {(c.values["dtype"], c.values["zero"], c.values["tp"]) for c in cases} == {("fp32", 0, 2)}


def test_full_zoo_file_lists_every_architecture_through_the_heuristic_and_each_preset_family():
    from parity.axes import ARCHITECTURES
    from parity.matrix.cases import load
    from parity.subjects.zoo import PRESET_OF

    cases = load([ROOT / "cases" / "zoo" / "full.toml"])
    for flag in ("false", "true"):
        heuristic = [c.values["arch"] for c in cases
                     if c.subject == "zoo_heuristic" and c.values["vocab_parallel_lm_head"] == flag]
        preset = [c.values["arch"] for c in cases
                  if c.subject == "zoo_preset" and c.values["vocab_parallel_lm_head"] == flag]
        assert sorted(heuristic) == sorted(ARCHITECTURES), flag
        assert sorted(preset) == sorted(PRESET_OF), flag


def test_preset_specs_are_the_installed_deepspeed_presets():
    """The claims' copy of AutoTPPresets (parity/subjects/zoo.py PRESET_SPECS) is the installed DeepSpeed's."""
    if find_spec("deepspeed") is None:
        skip_or_fail("deepspeed is not installed (requirements-cpu.txt pins it)")
    from deepspeed.module_inject.autotp_config import AutoTPPresets

    from parity.subjects.zoo import PRESET_OF, PRESET_SPECS

    for preset in set(PRESET_OF.values()):
        installed = tuple((p, s.partition_type.value, s.shape) for s in AutoTPPresets.get_preset(preset).layer_specs
                          for p in s.patterns)
        assert PRESET_SPECS[preset] == installed, preset


def test_autotp_sizes_cut_attention_by_kv_heads_and_the_rest_near_evenly():
    from parity.subjects.zoo import autotp_sizes, contiguous, packed

    assert autotp_sizes(32, 3, 4, "model.layers.0.self_attn.q_proj") == [16, 8, 8]  # 4 kv heads: 2/1/1
    assert autotp_sizes(16, 3, 2, "model.layers.0.self_attn.k_proj") == [8, 8, 0]  # 2 kv heads over 3 ranks
    assert autotp_sizes(64, 3, 4, "model.layers.0.mlp.up_proj") == [22, 21, 21]
    assert autotp_sizes(125, 3, 1, "lm_head") == [42, 42, 41]
    assert contiguous([2, 1]) == (((0, 2),), ((2, 3),))
    assert packed([4, 4], 2, None, "mlp") == (((0, 2), (4, 6)), ((2, 4), (6, 8)))


@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "phi"])
def test_heuristic_claims_follow_the_parsers_name_rules(arch):
    """The heuristic's row layers: o_proj / down_proj by name, GPT-NeoX's attention.dense by model name, the Linear
    before a block's first norm (cyclically: the block's last Linear, dense_4h_to_h, fc2); the rest column."""
    subject = SUBJECTS["zoo_heuristic"]
    claims = subject.claims(resolve(subject, {"arch": arch}))
    rows = {p.split(".", 3)[-1] for p, t in claims.module_types.items() if t == "LinearAllreduce"}
    assert rows == {"llama": {"self_attn.o_proj", "mlp.down_proj"},
                    "gpt_neox": {"attention.dense", "mlp.dense_4h_to_h"},
                    "phi": {"self_attn.dense", "mlp.fc2"}}[arch]
    assert claims.module_types[subject.info(resolve(subject, {"arch": arch}))["head"]] == "Linear"


def test_heuristic_refusals_and_plan_removal():
    import torch

    from parity.subjects.zoo import heuristic_info

    assert heuristic_info("gpt2", 2)["refusal"] == "AutoTP not supported for model"
    assert heuristic_info("llama", 2)["refusal"] is None
    subject = SUBJECTS["zoo_heuristic"]
    model = subject.build(resolve(subject, {"arch": "llama"}), torch.float32)
    assert model.config.base_model_tp_plan is None and type(model)._tp_plan is None
    assert model.__dict__["_tp_plan"] is None and type(model).__name__ == "LlamaForCausalLM"
    from transformers import LlamaForCausalLM

    assert LlamaForCausalLM._tp_plan  # the class itself keeps its plan
