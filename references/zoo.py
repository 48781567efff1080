"""Every causal-LM architecture of the installed transformers, built tiny from its own config class.

No hub access: a model is ``AutoModelForCausalLM.from_config`` of ``AutoConfig.for_model(model_type, **overrides)``
with seeded random weights. ``tiny_config`` shrinks widths, depths, vocabularies and expert counts but keeps what the
output head and the embedding depend on (tying, head bias, logit softcapping and scaling, embedding scale, the
attention layout's MHA/GQA/MQA kind, MoE, sliding windows, MLA, the text config nested in a vision-language wrapper),
so a tensor-parallel question asked of the tiny model is the question the full one poses. ``traits`` reads those
properties back from a config or a built model. ``python -m references.zoo --census FILE`` builds every
architecture, runs one forward (the model's own loss) and backward, and writes the table docs/zoo-census.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from references.seeding import seeded

VOCAB = 125  # odd and not a multiple of 3: a vocabulary shard is uneven at TP 2 and at TP 3
HEAD_DIM = 8  # hidden = heads * HEAD_DIM: 32 (4 heads), 48 (6) or 64 (8)
LAYERS = 2  # text stacks; a wrapper's other towers (vision, audio) get VISION_LAYERS
VISION_LAYERS = 1
EXPERTS, TOP_K = 4, 2
SLIDING_WINDOW = 4  # shorter than the census's 6 tokens, so the window masks something
SSM_CHUNK = 4  # a state-space scan's chunk: shorter than 6 tokens, so the scan carries state across chunks
SSM_STATE = 16  # a state-space layer's state size
SSM_STATE_KEYS = ("mamba_d_state", "ssm_state_size", "state_size")
SSM_SIZES = {"mamba_chunk_size": SSM_CHUNK, "chunk_size": SSM_CHUNK, **dict.fromkeys(SSM_STATE_KEYS, SSM_STATE)}
MLA = {"kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8}
WIDE = 32  # any other width field (*_size, *_dim) above WIDE_OVER
WIDE_OVER = 64
BATCH, SEQ = 2, 6

# Names a config uses for the standard fields (besides its attribute_map).
HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "n_embed", "dim", "hidden_dim", "embed_dim", "model_dim", "d_embed")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
              "num_decoder_layers", "num_encoder_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
             "decoder_attention_heads")
KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "num_key_value_groups")
HEAD_DIM_KEYS = ("head_dim", "attention_head_dim", "kv_channels", "d_kv", "head_size", "d_head")
INTERMEDIATE_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "d_ff", "ffn_hidden_size", "decoder_ffn_dim",
                     "encoder_ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "expert_intermediate_size", "ffn_config_intermediate_size", "d_inner", "inner_hidden_size")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k", "num_selected_experts")
WINDOW_KEYS = ("sliding_window", "sliding_window_size")
SOFTCAP_KEYS = ("final_logit_softcapping",)
# Traits a shrunk user config keeps exactly (structure(): the head's and the embedding's math, the wrapper, MLA)
STRUCTURE_TRAITS = ("tied", "softcap", "logit_scale", "logits_scaling", "embed_scale", "mla", "vlm",
                    "base_model_tp_plan", "tp_plan_styles")
# Width-like names not to shrink generically: geometry of images and audio, token ids, positions, windows.
KEEP_WORDS = ("image", "patch", "vocab", "window", "chunk", "position", "batch", "token", "kernel", "pool", "cache",
              "max_", "sample", "frame", "mel", "spatial", "temporal", "merge", "grid", "codebook", "stride",
              "bucket", "num_")
# Scaled-embedding classes whose scale is applied in forward, not stored as ``embed_scale``.
SCALED_EMBEDDING_WORDS = ("ScaledWordEmbedding", "ScaledEmbedding")


def mapping() -> dict[str, str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def architectures() -> list[tuple[str, str]]:
    """(model_type, class name) of every causal-LM architecture the installed transformers maps, sorted."""
    return sorted(mapping().items())


def _first(d: dict, keys) -> str | None:
    return next((k for k in keys if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)


def _tiny_heads(heads: int, kv: int | None) -> tuple[int, int]:
    """MQA stays 4/1; MHA 6/6 where the original count is a multiple of 3, else 4/4; GQA keeps its group size up to
    4 with 2 kv heads (4/2, 6/2, 8/2), so TP 2 and 3 still meet even and uneven head splits."""
    if kv is None or kv == heads:
        n = 6 if heads % 3 == 0 else 4
        return n, n
    if kv == 1:
        return 4, 1
    group = max(1, heads // kv)
    return 2 * min(group, 4), 2


def _shrink(cls, d: dict, text: bool) -> dict:
    """Overrides for one (sub-)config whose defaults are ``d`` (its to_dict()): only keys it has."""
    out: dict[str, Any] = {}
    amap = getattr(cls, "attribute_map", {}) or {}

    def key(standard: str, candidates) -> str | None:
        real = amap.get(standard)
        if real in d and isinstance(d[real], int):
            return real
        return _first(d, candidates)

    h_key = key("num_attention_heads", HEAD_KEYS)
    kv_key = key("num_key_value_heads", KV_KEYS)
    heads = d[h_key] if h_key else None
    kv = d[kv_key] if kv_key else None
    if d.get("multi_query") is True:
        kv = 1
    n_heads, n_kv = _tiny_heads(heads, kv) if heads else (4, 4)
    hidden = n_heads * HEAD_DIM
    if h_key:
        for k in HEAD_KEYS:
            if isinstance(d.get(k), int):
                out[k] = n_heads
        if amap.get("num_attention_heads") in d:
            out[amap["num_attention_heads"]] = n_heads
    if kv_key is None:
        kv_key = next((k for k in KV_KEYS if k in d and d[k] is None), None)  # unset default: MHA
    if kv_key and kv_key != "num_key_value_groups":
        out[kv_key] = n_kv
    elif kv_key == "num_key_value_groups":
        out[kv_key] = n_heads // n_kv
    h_real = key("hidden_size", HIDDEN_KEYS)
    if h_real:
        out[h_real] = hidden
    for k in HEAD_DIM_KEYS:
        if k in d and (d[k] is None or isinstance(d[k], int)):  # None: a default the checkpoint would fill
            out[k] = HEAD_DIM
    if isinstance(d.get("rotary_dim"), int) and d["rotary_dim"] > HEAD_DIM // 2:
        out["rotary_dim"] = HEAD_DIM // 2  # partial rotary stays partial
    if d.get("is_decoder") is False:
        out["is_decoder"] = True  # what a causal-LM head of an encoder family is built with
    layers = LAYERS if text else VISION_LAYERS
    l_key = key("num_hidden_layers", LAYER_KEYS)
    orig_layers = d[l_key] if l_key else None
    for k in LAYER_KEYS + ((amap["num_hidden_layers"],) if "num_hidden_layers" in amap else ()):
        if isinstance(d.get(k), int) and d[k] > layers:
            out[k] = layers
    # Per-layer lists (layer_types, ...): one layer of each distinct kind, in order of first appearance.
    if orig_layers:
        for k, v in d.items():
            if isinstance(v, list) and len(v) == orig_layers and v and all(isinstance(x, str) for x in v):
                kinds = list(dict.fromkeys(v))
                n = max(layers, len(kinds))
                out[k] = (kinds * n)[:n]
                for lk in LAYER_KEYS:
                    if lk in out or (isinstance(d.get(lk), int)):
                        out[lk] = n
    # A repeating block pattern ("recurrent", "recurrent", "attention"): each kind once.
    for k, v in d.items():
        if k.endswith("block_types") and isinstance(v, list) and v and all(isinstance(x, str) for x in v) \
                and k not in out:
            kinds = list(dict.fromkeys(v))
            out[k] = kinds
            if l_key and len(kinds) > out.get(l_key, layers):
                out[l_key] = len(kinds)
    # Hybrids placing attention or experts every period-th layer (Jamba): the second of the two layers.
    for k in ("attn_layer_period", "expert_layer_period"):
        if isinstance(d.get(k), int) and d[k] > 2:
            out[k] = 2
    for k in ("attn_layer_offset", "expert_layer_offset"):
        if isinstance(d.get(k), int) and d[k] > 1:
            out[k] = 1
    if "attn_layer_indices" in d and (d["attn_layer_indices"] is None or len(d["attn_layer_indices"]) > 1):
        out["attn_layer_indices"] = [LAYERS - 1]  # Bamba-style hybrids: unset means no attention layer at all
    # Mamba-2 scans pad every sequence to a whole chunk (256 by default) and carry a state of 128-256 per head:
    # left at their defaults, a tiny model spends seconds per forward there, so both are shrunk as other widths are.
    if any(k in d for k in SSM_STATE_KEYS):
        for k, v in SSM_SIZES.items():
            if isinstance(d.get(k), int) and d[k] > v:
                out[k] = v
    if isinstance(d.get("axial_pos_embds_dim"), list):
        out["axial_pos_embds_dim"] = [hidden // 2, hidden - hidden // 2]  # Reformer: they must sum to hidden
    # Leading dense layers before the MoE ones: one, so the second layer is an MoE layer.
    for k in ("first_k_dense_replace", "num_dense_layers", "first_dense_layers"):
        if isinstance(d.get(k), int) and d[k] > 1:
            out[k] = 1
    for k in INTERMEDIATE_KEYS:
        if isinstance(d.get(k), int) and d[k] > 2 * hidden:
            out[k] = 2 * hidden
    for k in EXPERT_KEYS:
        if isinstance(d.get(k), int) and d[k] > EXPERTS:
            out[k] = EXPERTS
    moe = any(k in d for k in EXPERT_KEYS) and any(k in d for k in TOPK_KEYS)
    for k in EXPERT_KEYS:
        if moe and k in d and d[k] is None:
            out[k] = EXPERTS  # unset default of an MoE config
    for k in TOPK_KEYS:
        if isinstance(d.get(k), int) and d[k] > TOP_K or moe and k in d and d[k] is None:
            out[k] = TOP_K
    if moe and "n_shared_experts" in d and d["n_shared_experts"] is None:
        out["n_shared_experts"] = 1
    for k in ("n_group", "num_expert_group"):
        if isinstance(d.get(k), int) and d[k] > 1:
            out[k] = 2
            if isinstance(d.get("topk_group"), int):
                out["topk_group"] = 1
    if isinstance(d.get("zero_expert_num"), int) and d["zero_expert_num"] > EXPERTS:
        out["zero_expert_num"] = EXPERTS
    for k in WINDOW_KEYS:
        if isinstance(d.get(k), int) and d[k] > SLIDING_WINDOW:
            out[k] = SLIDING_WINDOW
    for k, v in MLA.items():
        if isinstance(d.get(k), int):
            out[k] = v
    if isinstance(d.get("qk_head_dim"), int) and "qk_nope_head_dim" in out:
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out.get("qk_rope_head_dim", 0)
    for k, v in d.items():
        if k in out or not isinstance(v, int) or isinstance(v, bool):
            continue
        if k.endswith("vocab_size") and v > VOCAB:
            out[k] = VOCAB
        elif (k.endswith(("_size", "_dim", "_dims")) and v > WIDE_OVER
              and not any(w in k for w in KEEP_WORDS)):
            out[k] = WIDE
    for k, v in d.items():
        if ("dropout" in k or "pdrop" in k) and isinstance(v, float) and v > 0:
            out[k] = 0.0  # the forward is a function of the weights and inputs alone
    return out


def _clamp_ids(d: dict, out: dict, vocab, taken: set[int]) -> None:
    """Token ids (pad, bos, eos, image, ...) at or past the tiny vocabulary move to its top free rows, distinct."""
    if not isinstance(vocab, int):
        return
    free = (i for i in range(vocab - 1, 0, -1) if i not in taken)

    def fit(v):
        if isinstance(v, int) and not isinstance(v, bool) and v >= vocab:
            new = next(free)
            taken.add(new)
            return new
        return v

    for k, v in sorted(d.items()):
        if _is_id_key(k):
            new = [fit(x) for x in v] if isinstance(v, list) else fit(v)
            if new != v:
                out[k] = new


def _is_id_key(k: str) -> bool:
    return k.endswith(("token_id", "token_index", "token_ids", "_token")) or k == "pad_idx"


def tiny_config(model_type: str, tp: int = 3, user: str = ""):
    """``model_type``'s config with tiny sizes and its structure kept (module docstring); eager attention.

    ``tp`` is the degree the sizes are meant for: head and vocabulary counts are picked (_tiny_heads, VOCAB) so
    TP 2 and 3 meet both even and uneven splits; it changes nothing else. ``user``: a stored user config.json
    (store_config) to shrink instead of the class's defaults."""
    from transformers import AutoConfig

    del tp
    if user:
        raw = stored_config(user)
        if raw.get("model_type") != model_type:
            raise ValueError(f"stored config {user} is a {raw.get('model_type')!r} config, not {model_type!r}")
        return shrunk(config_from_dict(raw))
    base = AutoConfig.for_model(model_type)
    overrides = _config_overrides(base)
    config = AutoConfig.for_model(model_type, **overrides)
    _set_eager(config)
    return config


def _config_overrides(config, text: bool = True) -> dict:
    """tiny_config's overrides for ``config`` and, nested as partial dicts, its sub-configs; ``text``: this config
    is a text stack (LAYERS deep) rather than another tower (VISION_LAYERS)."""
    from transformers import CONFIG_MAPPING

    subs = [n for n in (getattr(config, "sub_configs", {}) or {}) if hasattr(getattr(config, n, None), "to_dict")]
    flat = {k: v for k, v in config.to_dict().items() if k not in subs}
    out = _shrink(type(config), flat, text)
    text_cfg = config.get_text_config(decoder=True)
    text_name = next((n for n in subs if getattr(config, n) is text_cfg), None)
    for name in subs:
        sub = getattr(config, name)
        sub_out = _config_overrides(sub, text=name == text_name)
        if sub.model_type in CONFIG_MAPPING:
            out[name] = {"model_type": sub.model_type, **sub_out}
        else:  # an unregistered part-config (DBRX's attn_config): its parent may read its defaults, so all of them
            out[name] = {**{k: v for k, v in sub.to_dict().items() if k != "transformers_version"}, **sub_out}
    if text_name is None:
        _clamp_ids(flat, out, out.get("vocab_size", flat.get("vocab_size")), set())
    else:
        # A wrapper's own ids (image, boi, ...) index the text model's vocabulary, beside the text config's ids.
        text_out = out[text_name]
        taken = {x for k, v in text_out.items() if _is_id_key(k) for x in (v if isinstance(v, list) else [v])
                 if isinstance(x, int)}
        _clamp_ids(flat, out, text_out.get("vocab_size", getattr(text_cfg, "vocab_size", None)), taken)
    return out


def config_store() -> Path:
    """Where user configs are kept by name: $PARITY_ARCH_CONFIGS, else ~/.cache/parity/arch_configs."""
    return Path(os.environ.get("PARITY_ARCH_CONFIGS") or Path.home() / ".cache" / "parity" / "arch_configs")


def store_config(raw: dict, stem: str) -> str:
    """Keep a user's config.json (as parsed) under a name made of ``stem`` and its content's hash, so a case names
    it by a short, stable string (the arch_config axis) and the ranks and the reference read the same dict."""
    text = json.dumps(raw, sort_keys=True, indent=1)
    slug = re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_")[:24] or "config"
    name = f"{slug}_{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    store = config_store()
    store.mkdir(parents=True, exist_ok=True)
    path = store / f"{name}.json"
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return name


def stored_config(name: str) -> dict:
    """The config store_config kept as ``name``."""
    path = config_store() / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"arch_config {name}: no {path} (parity check --arch CONFIG_JSON stores it)")
    return json.loads(path.read_text())


def structure(config) -> dict:
    """What a shrunk config must keep of the full one (STRUCTURE_TRAITS of _config_traits, the attention layout as
    its kind and group size, MoE and the sliding window as present or not, top-k as given where it is small)."""
    t = _config_traits(config)
    heads, kv = t["heads"], t["kv_heads"]
    if heads and kv:
        layout = "MHA" if kv == heads else "MQA" if kv == 1 else f"GQA{heads // kv}" if heads // kv <= 4 else "GQA>4"
    else:
        layout = None
    return {**{k: t[k] for k in STRUCTURE_TRAITS}, "attention": layout, "moe": bool(t["experts"]),
            "experts_per_token": min(t["experts_per_token"], TOP_K) if t["experts_per_token"] else None,
            "sliding_window": t["sliding_window"] is not None}


def config_from_dict(raw: dict):
    """A config.json's dict as its model_type's config class reads it (AutoConfig.for_model: no hub access)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})


def shrunk(config):
    """``config`` with tiny_config's overrides for it applied, its own values kept elsewhere (a user's config.json
    shrunk as the zoo shrinks a config class's defaults); eager attention."""
    from transformers import AutoConfig

    def merge(base: dict, over: dict) -> dict:
        return {**base, **{k: merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                           for k, v in over.items()}}

    merged = merge(config.to_dict(), _config_overrides(config))
    for key in ("model_type", "transformers_version", "architectures", "_name_or_path"):
        merged.pop(key, None)
    config = AutoConfig.for_model(config.model_type, **merged)
    _set_eager(config)
    return config


def _set_eager(config) -> None:
    config._attn_implementation = "eager"
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            _set_eager(sub)


def build(model_type: str, dtype: torch.dtype = torch.float32, seed: int = 0, user: str = ""):
    """The tiny model, weights drawn in fp32 from ``seed`` then cast (as references.tiny_lm.build_model); ``user``:
    a stored user config (tiny_config)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, user=user)
    with seeded(seed):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(dtype)
    if hasattr(model, "set_default_language") and getattr(config, "languages", None):
        model.set_default_language(config.default_language or config.languages[0])  # X-MOD's adapters need one
    return model


def _text(config):
    return config.get_text_config(decoder=True)


def _get(config, *names):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return None


def _config_traits(config) -> dict:
    text = _text(config)
    heads = _get(text, "num_attention_heads")
    kv = _get(text, *KV_KEYS[:4])
    if getattr(text, "multi_query", False) is True:
        kv = 1
    experts = _get(text, *EXPERT_KEYS)
    topk = _get(text, *TOPK_KEYS)
    plan = getattr(text, "base_model_tp_plan", None) or getattr(config, "base_model_tp_plan", None) or {}
    tied = getattr(config, "tie_word_embeddings", None)
    if tied is None:
        tied = getattr(text, "tie_word_embeddings", None)
    embed = None
    if getattr(text, "scale_embedding", False):
        embed = "scale_embedding"
    for name in ("embedding_multiplier", "scale_emb", "embed_scale", "embedding_scale", "emb_scale"):
        v = getattr(text, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v != 1:
            embed = f"{name}={v:g}"
    return {
        "tied": bool(tied),
        "softcap": getattr(text, "final_logit_softcapping", None),
        "logit_scale": getattr(text, "logit_scale", None),
        "logits_scaling": getattr(text, "logits_scaling", None),
        "embed_scale": embed,
        "heads": heads if isinstance(heads, int) else None,
        "kv_heads": kv if isinstance(kv, int) else (heads if isinstance(heads, int) else None),
        "experts": experts if isinstance(experts, int) else None,
        "experts_per_token": topk if isinstance(topk, int) else None,
        "sliding_window": _get(text, *WINDOW_KEYS),
        "mla": getattr(text, "kv_lora_rank", None) is not None,
        "vlm": text is not config,
        "base_model_tp_plan": bool(plan),
        "tp_plan_styles": sorted({str(s) for s in plan.values()}),
    }


def _module_path(model, module) -> str | None:
    return next((name for name, m in model.named_modules() if m is module), None)


def traits(obj) -> dict:
    """What the head and embedding depend on, read from a config or (more exactly) from a built model."""
    if not hasattr(obj, "named_modules"):
        return _config_traits(obj)
    model = obj
    out = _config_traits(model.config)
    head = model.get_output_embeddings()
    emb = model.get_input_embeddings()
    out["head"] = _module_path(model, head) if head is not None else None
    out["head_bias"] = getattr(head, "bias", None) is not None if head is not None else None
    hw, ew = getattr(head, "weight", None), getattr(emb, "weight", None)
    out["tied"] = hw is not None and ew is not None and hw is ew
    scale = getattr(emb, "embed_scale", None)
    if scale is not None and float(scale) != 1.0:
        out["embed_scale"] = f"{type(emb).__name__}={float(scale):g}"
    elif scale is None and any(w in type(emb).__name__ for w in SCALED_EMBEDDING_WORDS):
        out["embed_scale"] = type(emb).__name__
    out["class_tp_plan"] = dict(getattr(type(model), "_tp_plan", None) or {})
    out["tp_plan_styles"] = sorted(set(out["tp_plan_styles"]) | {str(s) for s in out["class_tp_plan"].values()})
    return out


def special_ids(config) -> set[int]:
    """Every token id a config names, its own and its sub-configs' (input ids avoid them: an image token without
    pixels is an error in a VLM)."""
    found: set[int] = set()
    for k, v in config.to_dict().items():
        if isinstance(v, dict):
            continue
        if k.endswith(("token_id", "token_index", "token_ids", "_token")) or k in ("pad_idx",):
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, int) and not isinstance(x, bool):
                    found.add(x)
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            found |= special_ids(sub)
    return found


def sample_ids(model, seed: int = 0) -> torch.Tensor:
    """A BATCH x SEQ batch of ordinary token ids (none of the config's special ids), from ``seed``."""
    vocab = _text(model.config).vocab_size
    allowed = torch.tensor([i for i in range(vocab) if i not in special_ids(model.config)])
    g = torch.Generator().manual_seed(seed)
    return allowed[torch.randint(len(allowed), (BATCH, SEQ), generator=g)]


def forward_backward(model, seed: int = 0) -> float:
    """One training forward on sample_ids with labels (the model's own loss) and its backward; returns the loss."""
    import inspect

    ids = sample_ids(model, seed)
    kwargs = {"input_ids": ids, "labels": ids.clone()}
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        kwargs["token_type_ids"] = torch.zeros_like(ids)
    model.train()
    out = model(**kwargs)
    loss = out.loss if hasattr(out, "loss") else out[0]
    loss.backward()
    return loss.item()


# ---- census -----------------------------------------------------------------------------------------------------

def census_one(model_type: str) -> dict:
    """Build, forward and backward one architecture; a failure is recorded as its exception's type and first line."""
    start = time.perf_counter()
    row: dict[str, Any] = {"model_type": model_type, "class": mapping()[model_type]}
    try:
        model = build(model_type)
        row["params"] = sum(p.numel() for p in model.parameters())
        row.update(traits(model))
        row["loss"] = forward_backward(model)
        if not math.isfinite(row["loss"]):
            raise FloatingPointError(f"loss is {row['loss']}")
        row["status"] = "built"
    except BaseException as exc:  # noqa: BLE001 - a census row, whatever the failure
        if isinstance(exc, KeyboardInterrupt):
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        if exc.__cause__ is not None and first.endswith(":"):  # a wrapper (huggingface_hub's validation)
            first += " " + (str(exc.__cause__).strip().splitlines() or [""])[0]
        first = first[:200]
        row["status"] = "skipped"
        row["reason"] = f"{type(exc).__name__}: {first}"
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def _worker(conn) -> None:
    torch.set_num_threads(1)
    while True:
        model_type = conn.recv()
        if model_type is None:
            return
        conn.send(census_one(model_type))


def census(types: list[str], limit_s: float = 120.0) -> list[dict]:
    """census_one for each type in a child process; one that passes ``limit_s`` (or kills its process) is recorded
    as skipped and the next runs in a fresh process."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    rows, proc, conn = [], None, None
    for model_type in types:
        if proc is None:
            conn, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child,), daemon=True)
            proc.start()
        conn.send(model_type)
        if conn.poll(limit_s):
            try:
                rows.append(conn.recv())
                print(f"{model_type}: {rows[-1]['status']} {rows[-1].get('reason', '')}", file=sys.stderr)
                continue
            except EOFError:
                reason = f"ProcessDied: exit code {proc.exitcode}"
        else:
            reason = f"Timeout: over {limit_s:g} s"
        proc.kill()
        proc.join()
        proc = None
        rows.append({"model_type": model_type, "class": mapping()[model_type], "status": "skipped",
                     "reason": reason})
        print(f"{model_type}: skipped {reason}", file=sys.stderr)
    if proc is not None:
        conn.send(None)
        proc.join(10)
    return rows


def _cell(v) -> str:
    if v is None or v is False or v == [] or v == "":
        return ""
    if v is True:
        return "yes"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return ", ".join(map(str, v))
    return str(v).replace("|", "\\|")


COLUMNS = ("model_type", "class", "status", "params", "tied", "head", "head_bias", "softcap", "logit_scale",
           "logits_scaling", "embed_scale", "attention", "experts", "sliding_window", "mla", "vlm", "tp_plan_styles")


def markdown(rows: list[dict], seconds: float, command: str) -> str:
    import transformers

    built = sum(r["status"] == "built" for r in rows)
    lines = [
        "# Tiny-architecture census (generated)",
        "",
        f"transformers {transformers.__version__}, torch {torch.__version__}: every entry of "
        "`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, built by `references/zoo.py` from its config class with tiny sizes "
        f"(fp32, CPU, seed 0), one forward on a {BATCH}x{SEQ} batch with labels (the model's own loss) and one "
        f"backward. {built} built, {len(rows) - built} skipped, {seconds:.0f} s in all.",
        "",
        f"Regenerate: `{command}`",
        "",
        "attention: heads/kv heads of the tiny text config. tp_plan styles: the partition styles of the config's "
        "base_model_tp_plan and the class's _tp_plan together.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        cells = []
        for c in COLUMNS:
            if c == "status":
                v = "built" if r["status"] == "built" else f"skipped ({r['reason']})"
            elif c == "attention":
                v = f"{r['heads']}/{r['kv_heads']}" if r.get("heads") else ""
            elif c == "experts":
                v = f"{r['experts']} (top {r['experts_per_token']})" if r.get("experts") else ""
            else:
                v = r.get(c)
            cells.append(_cell(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table_types(text: str) -> list[tuple[str, str]]:
    """(model_type, class) of each row of a census table written by markdown()."""
    found = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 3 and cells[0] not in ("model_type",) and \
                not cells[0].startswith("-"):
            found.append((cells[0], cells[1]))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m references.zoo", description=__doc__.splitlines()[0])
    parser.add_argument("--census", metavar="MD", help="write the markdown census table here")
    parser.add_argument("--json", metavar="FILE", help="write the census rows as JSON here")
    parser.add_argument("--only", nargs="*", help="these model types only")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds per architecture")
    args = parser.parse_args(argv)
    types = args.only or [t for t, _ in architectures()]
    start = time.perf_counter()
    rows = census(types, args.limit)
    seconds = time.perf_counter() - start
    command = "python -m references.zoo " + " ".join(
        f"--{k} {v}" for k, v in (("census", args.census), ("json", args.json)) if v)
    if args.census:
        with open(args.census, "w") as f:
            f.write(markdown(rows, seconds, command))
    if args.json:
        import transformers

        with open(args.json, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                       "seconds": round(seconds, 1), "rows": rows}, f, indent=1, default=str)
            f.write("\n")
    built = sum(r["status"] == "built" for r in rows)
    print(f"{built} built, {len(rows) - built} skipped, {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
