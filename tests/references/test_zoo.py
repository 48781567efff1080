"""references/zoo.py: the census lists exactly the installed architectures, and the tiny configs keep what the output
head and embedding depend on."""
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from tests.conftest import skip_or_fail

if find_spec("transformers") is None:
    skip_or_fail("transformers is not installed (pip install -e '.[hf]'); requirements-cpu.txt pins it")

from references import zoo  # noqa: E402

CENSUS = Path(__file__).resolve().parents[2] / "docs" / "zoo-census.md"


def test_census_rows_are_the_installed_mapping():
    # Staleness: a transformers upgrade that adds, drops or renames an architecture needs a new census.
    listed = zoo.table_types(CENSUS.read_text())
    assert listed == zoo.architectures(), "regenerate: python -m references.zoo --census docs/zoo-census.md"


def test_census_header_names_the_installed_versions():
    import transformers

    head = CENSUS.read_text()[:2000]
    assert f"transformers {transformers.__version__}" in head
    assert "python -m references.zoo --census docs/zoo-census.md" in head


def test_tiny_config_is_deterministic():
    assert zoo.tiny_config("gemma2").to_dict() == zoo.tiny_config("gemma2").to_dict()


# (model_type, what traits() must report for the tiny config and the built model)
REPRESENTATIVE = {
    "llama": {"tied": False, "heads": 4, "kv_heads": 4, "softcap": None, "vlm": False},
    "mistral": {"tied": False, "heads": 8, "kv_heads": 2, "sliding_window": zoo.SLIDING_WINDOW},
    "gemma2": {"tied": True, "softcap": 30.0, "heads": 4, "kv_heads": 2},
    "cohere": {"tied": True, "logit_scale": 0.0625},
    "granite": {"logits_scaling": 1.0},
    "mixtral": {"experts": zoo.EXPERTS, "experts_per_token": 2, "heads": 8, "kv_heads": 2},
    "qwen2_moe": {"experts": zoo.EXPERTS},
    "deepseek_v3": {"mla": True, "experts": zoo.EXPERTS},
    "gemma3": {"vlm": True, "tied": True},
}


@pytest.mark.parametrize("model_type", sorted(REPRESENTATIVE))
def test_tiny_config_keeps_structure(model_type):
    config = zoo.tiny_config(model_type)
    text = config.get_text_config(decoder=True)
    assert text.vocab_size == zoo.VOCAB and text.hidden_size <= 64 and text.num_hidden_layers <= 2
    got = zoo.traits(config)
    for key, want in REPRESENTATIVE[model_type].items():
        assert got[key] == want, (key, got[key], want)
    assert got["base_model_tp_plan"]


@pytest.mark.parametrize("model_type", sorted(REPRESENTATIVE))
def test_tiny_model_builds_and_trains_a_step(model_type):
    model = zoo.build(model_type)
    loss = zoo.forward_backward(model)
    # Tiny: a text tower of at most a few hundred thousand parameters (the census's seconds are its timing, not a test).
    assert sum(p.numel() for p in model.get_decoder().parameters()) < 1_000_000
    assert torch.isfinite(torch.tensor(loss))
    assert all(p.grad is not None for p in model.get_output_embeddings().parameters())
    got = zoo.traits(model)
    for key, want in REPRESENTATIVE[model_type].items():
        assert got[key] == want, (key, got[key], want)
    assert got["head"] == "lm_head" and got["head_bias"] is False
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    assert (head.weight is emb.weight) == REPRESENTATIVE[model_type].get("tied", False) or "tied" not in \
        REPRESENTATIVE[model_type]


def test_gemma_family_scales_its_embedding():
    model = zoo.build("gemma2")
    assert zoo.traits(model)["embed_scale"].endswith(f"={model.config.hidden_size ** 0.5:g}")


def test_same_seed_same_weights():
    a, b = zoo.build("llama", seed=3), zoo.build("llama", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
