"""The ``config`` a Hugging Face model carries, as plain attributes: what a framework may read off the
user's model besides its modules (DeepSpeed's AutoTP reads the head counts, tp_shard.AutoTPMeta).

A config is metadata: the unsharded model computes the same numbers with or without one, so the
reference trajectory never reads it and cases that differ only in their config share one reference.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HFLikeConfig:
    """The attributes of a transformers PretrainedConfig that name sizes; absent ones are None, which
    is what getattr(config, name, None) reads from a real config that lacks them."""
    model_type: str = "tiny_lm"
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    tie_word_embeddings: bool = False
    # A multimodal model's text tower (LLaVA, PaliGemma, ...): its head counts live here while the
    # outer config carries the vision tower's.
    text_config: HFLikeConfig | None = None


# name -> the head counts of the model's attention (the tiny model has none: only the config says so).
# heads4: a plain multi-head transformer (kv heads = query heads, nothing else spelled out).
# kv3: grouped-query attention, 6 query heads over 3 key/value heads (num_key_value_heads is set).
# kv1: multi-query attention, 4 query heads sharing one key/value head.
# text_kv3: a multimodal config: 16 vision heads outside, kv3's text tower in text_config.
MODEL_CONFIGS = {
    "none": None,
    "heads4": {"num_attention_heads": 4},
    "kv3": {"num_attention_heads": 6, "num_key_value_heads": 3},
    "kv1": {"num_attention_heads": 4, "num_key_value_heads": 1},
    "text_kv3": {"num_attention_heads": 16, "text_config": {"num_attention_heads": 6, "num_key_value_heads": 3}},
}


def hf_like_config(name: str, vocab: int, hidden: int, tied: bool) -> HFLikeConfig | None:
    """The config named ``name`` for a model of these sizes; None for "none" (the model has no config)."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"model_config must be one of {sorted(MODEL_CONFIGS)}, got {name!r}")
    heads = MODEL_CONFIGS[name]
    if heads is None:
        return None
    sizes = {"vocab_size": vocab, "hidden_size": hidden, "tie_word_embeddings": tied}
    text = heads.get("text_config")
    return HFLikeConfig(**sizes, **{**heads, "text_config": None if text is None else HFLikeConfig(**sizes, **text)})


def text_kv_heads(name: str) -> int | None:
    """How many key/value heads the named config's text model has, by transformers' rule: num_key_value_heads,
    or num_attention_heads where it is not set (plain multi-head attention); a multimodal config's text tower."""
    heads = MODEL_CONFIGS[name]
    if heads is None:
        return None
    text = heads.get("text_config", heads)
    return text.get("num_key_value_heads", text.get("num_attention_heads"))
