"""Reach (issue 13): which module DeepSpeed takes for the head when the user names it otherwise. What each case hands
DeepSpeed and claims, without a rank; the spec is read back with re.match, as TPLayerSpec.matches does."""
import re

import pytest
import torch

from parity.explore.domains import HELD_AXES
from parity.matrix.cases import CASES_DIR, load_file
from parity.subjects import SUBJECTS
from parity.subjects.deepspeed_reach import BLOCKS
from references.tiny_lm import ModelSpec, TinyLlamaModel, build_model

HEADS = load_file(CASES_DIR / "deepspeed_heads.toml")


def _values(subject, **axes):
    from parity.subjects.values import resolve

    return resolve(SUBJECTS[subject], axes)


def _head_spec(values):
    specs = SUBJECTS["spec_reach"].tensor_parallel_config(values)["partition_config"]["layer_specs"]
    return next(s for s in specs if s["partition_type"] == "column")


def test_anchored_spec_misses_the_nested_head_only_at_its_start():
    spec = _head_spec(_values("spec_reach", reach="anchored", head="model.lm_head"))
    assert not any(re.match(p, "model.lm_head.weight") for p in spec["patterns"])
    assert any(re.search(p, "model.lm_head.weight") for p in spec["patterns"])  # the user's reading of it
    assert "model_types" not in spec


def test_anchored_needs_a_nested_head():
    with pytest.raises(ValueError, match="needs a nested head"):
        SUBJECTS["spec_reach"].tensor_parallel_config(_values("spec_reach", reach="anchored", head="lm_head"))


@pytest.mark.parametrize("reach", ["model_types", "model_types_config"])
def test_model_types_spec_matches_the_head_by_name_and_differs_only_in_the_config(reach):
    values = _values("spec_reach", reach=reach)
    spec = _head_spec(values)
    assert spec["model_types"] == ["llama"] and any(re.match(p, "lm_head.weight") for p in spec["patterns"])
    config = getattr(SUBJECTS["spec_reach"].build(values, torch.float32), "config", None)
    assert (getattr(config, "model_type", None) == "llama") == (reach == "model_types_config")


def test_every_reach_claims_what_the_user_asked_for():
    claims = {r: SUBJECTS["spec_reach"].claims(_values("spec_reach", reach=r)) for r in
              ("model_types", "model_types_config")}
    assert claims["model_types"] == claims["model_types_config"]
    assert claims["model_types"].module_types["lm_head"] == "LinearLayer"
    assert HELD_AXES["reach"][0] == "model_types_config"
    # The no-match finding marks exactly the two reaches that match nothing (model_types_config carries only the
    # ZeRO 0 bf16 gradient-dtype mark every engine head has).
    marked = {c["reach"] for c in HEADS if c.subject == "spec_reach" and c.divergence
              and "deepspeed_spec_matches_nothing.py" in c.divergence.repro}
    assert marked == {"anchored", "model_types"}


@pytest.mark.parametrize("subject", ["preset_llama", "heuristic_blocks"])
@pytest.mark.parametrize("vplm", ["true", "false"])
def test_llama_subjects_claim_every_block_linear_and_name_no_head_spec(subject, vplm):
    values = _values(subject, vocab_parallel_lm_head=vplm)
    config = SUBJECTS[subject].tensor_parallel_config(values)
    assert "partition_config" not in config and config["vocab_parallel_lm_head"] is (vplm == "true")
    assert config.get("preset_model") == ("llama" if subject == "preset_llama" else None)
    model = SUBJECTS[subject].build(values, torch.float32)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("layers.")}
    claims = SUBJECTS[subject].claims(values)
    assert linears == {n for n in claims.module_types if n.startswith("layers.")} and len(linears) == 7 * BLOCKS
    assert claims.module_types["lm_head"] == ("VocabParallelLinear" if vplm == "true" else "Linear")


def test_tiny_llama_model_has_what_the_heuristic_parser_needs():
    model = build_model(ModelSpec(vocab=35, hidden=32, blocks=2), 0, torch.float32)
    assert isinstance(model, TinyLlamaModel)
    assert re.match(r"(.*?)Model", str(model))  # AutoTP.supported's last resort: the repr's first class name
    assert isinstance(model.layers, torch.nn.ModuleList) and len(model.layers) == 2
    assert type(build_model(ModelSpec(vocab=35, hidden=32), 0, torch.float32)).__name__ == "TinyCausalLM"


def test_block_head_is_registered_in_the_block_and_claimed_gathered_on_the_heuristic_path():
    spec = ModelSpec(vocab=35, hidden=32, blocks=BLOCKS)
    plain, in_block = (build_model(spec.__class__(**{**spec.__dict__, "head_name": name}), 7, torch.float32)
                       for name in ("lm_head", "layers.1.lm_head"))
    assert not hasattr(in_block, "lm_head") and isinstance(in_block.layers[1].lm_head, torch.nn.Linear)
    # The same weights and the same function wherever the head is registered: the reference differs in no number.
    plain_state = plain.state_dict()
    assert all(torch.equal(t, plain_state[k.replace("layers.1.lm_head", "lm_head")])
               for k, t in in_block.state_dict().items())
    ids = torch.randint(0, 35, (2, 5), generator=torch.Generator().manual_seed(0))
    assert torch.equal(plain(ids)[1], in_block(ids)[1])
    subject = SUBJECTS["heuristic_blocks"]
    cases = [c for c in HEADS if c.subject == "heuristic_blocks" and c["head"] == "layers.1.lm_head"]
    assert {c["vocab_parallel_lm_head"] for c in cases} == {"true", "false"}
    for case in cases:
        claims = subject.claims(case.values)
        if case["vocab_parallel_lm_head"] == "false":
            assert claims.module_types["layers.1.lm_head"] == "LinearLayer"
            assert not case.divergence or "zero0_low_precision_grad_dtype" in case.divergence.repro
            assert claims.param_shards["layers.1.lm_head.weight"] == 0
        else:  # claimed as asked; DeepSpeed raises after sharding (the crash divergence)
            assert claims.module_types["layers.1.lm_head"] == "VocabParallelLinear"
            assert case.divergence.raises.startswith("RuntimeError: ")
    assert "layers.1.lm_head" not in SUBJECTS["preset_llama"].axes["head"]
