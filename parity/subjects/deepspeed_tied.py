"""DeepSpeed 0.19.8 AutoTP output heads whose weight IS the input embedding's weight (tied): each must keep one
Parameter per rank, sharded once (docs/subjects.md#tied-heads)."""
from __future__ import annotations

import dataclasses
from importlib.util import find_spec

import torch

from parity.subjects.base import Claims, padding_index
from parity.subjects.deepspeed_autotp import COMMON_AXES, ColumnGatheredHead, VocabParallelHead, reports_grad_norm
from parity.subjects.deepspeed_row import RowParallelHead

TIED_AXES = {"padding": None, "embed_spec": None, "embed_scale": None}
SHARED = (("lm_head.weight", "embed_tokens.weight"),)


def embed_specs(values: dict) -> list:
    kind = values["embed_spec"]
    return [] if kind == "none" else [{"patterns": [r"embed_tokens\.weight$"], "partition_type": kind}]


def tied_spec(spec, values):
    return dataclasses.replace(spec, tied=True, padding_idx=padding_index(values),
                               scale_grad_by_freq=values.optional("grad_freq", False),
                               embed_scale=values.optional("embed_scale", "none") == "gemma3")


def gemma3_unavailable(values: dict) -> str | None:
    if values.optional("embed_scale", "none") == "gemma3" and find_spec("transformers") is None:
        return "transformers is not installed (pip install -e '.[hf]'): Gemma3TextScaledWordEmbedding"
    return None


def gemma3_embedding(plain: torch.nn.Embedding):
    """transformers' Gemma3TextScaledWordEmbedding of ``plain``'s shape and padding_idx (its buffer sqrt(hidden) in
    float32, as from_pretrained builds it)."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    vocab, hidden = plain.weight.shape
    return Gemma3TextScaledWordEmbedding(vocab, hidden, plain.padding_idx, embed_scale=hidden ** 0.5)


def as_gemma3_embedding(model):
    """The user's Gemma3 model holds transformers' own class, the one custom embedding forward AutoTP's embedding
    layers accept (by module and name); the reference's plain-torch twin is swapped for it, the tied Parameter kept."""
    plain = model.embed_tokens
    scaled = gemma3_embedding(plain)
    scaled.scale_grad_by_freq, scaled.max_norm = plain.scale_grad_by_freq, plain.max_norm
    scaled.to(plain.weight.dtype)  # the buffer, cast with the model as from_pretrained(torch_dtype=...) leaves it
    scaled.weight = plain.weight
    model.embed_tokens = scaled
    return model


class Gemma3Embedding:
    """Mixin over an engine head: embed_scale "gemma3" hands the engine transformers' scaled embedding."""

    def build(self, values, dtype):
        model = super().build(values, dtype)
        return as_gemma3_embedding(model) if values.optional("embed_scale", "none") == "gemma3" else model

    def unavailable_reason(self, values):
        return gemma3_unavailable(values) or super().unavailable_reason(values)


class TiedEmbedding(Gemma3Embedding):
    """What both tied subjects add to their untied parent: a tied model, and the optional explicit
    embedding spec placed before the head's so the AutoTP walk visits it first."""

    def model_spec(self, values):
        return tied_spec(super().model_spec(values), values)

    def tensor_parallel_config(self, values):
        config = super().tensor_parallel_config(values)
        config["partition_config"]["layer_specs"][:0] = embed_specs(values)
        return config


class TiedRowParallelHead(TiedEmbedding, RowParallelHead):
    name = "tied_row_parallel"
    feature = "tied embedding / head"
    description = ("#8680: tied lm_head as row-parallel LinearAllreduceWithReplicatedInput; its embedding "
                   "becomes HiddenParallelEmbedding sharing the head's hidden shard (one Parameter, dim 1).")
    # Only lm_head for now (the claims name it); grad_freq only here (docs/subjects.md#tied-heads).
    axes = {**COMMON_AXES, "head": ("lm_head",), **TIED_AXES, "save": None, "grad_freq": None}

    def claims(self, values):
        return Claims(module_types={"lm_head": "LinearAllreduceWithReplicatedInput", "proj": "Linear",
                                    "embed_tokens": "HiddenParallelEmbedding"},
                      param_shards={"embed_tokens.weight": 1, "lm_head.bias": None},
                      shared_params=SHARED)


class TiedVocabParallelHead(TiedEmbedding, VocabParallelHead):
    name = "tied_vocab_parallel"
    feature = "tied embedding / head"
    description = ("#8859: tied vocab_parallel_lm_head; the embedding becomes VocabParallelEmbedding sharing "
                   "the head's vocabulary shard (one Parameter, dim 0); local logits, DeepSpeed's CE (torch).")
    # head model.lm_head: reached by AutoTP's kv-head split; no autocast_modules (docs/subjects.md#tied-heads).
    axes = {**{k: v for k, v in VocabParallelHead.axes.items() if k != "autocast_modules"},
            "head": ("lm_head", "model.lm_head"), **TIED_AXES, "process": None}

    def claims(self, values):
        base, head = super().claims(values), values["head"]
        return dataclasses.replace(
            base, module_types={**base.module_types, "embed_tokens": "VocabParallelEmbedding"},
            param_shards={"embed_tokens.weight": 0, f"{head}.bias": 0},
            shared_params=((f"{head}.weight", "embed_tokens.weight"),))


class TiedColumnGatheredHead(TiedEmbedding, ColumnGatheredHead):
    name = "tied_column_gathered"
    feature = "tied embedding / head"
    description = ("A gathered column spec on a tied head: AutoTP's tie fallback leaves the head and its embedding "
                   "replicated and tied (one Parameter, unsharded), with a warning; full logits, the suite's CE.")
    # head output: the spec's pattern and the fallback's spec lookup (find_matching_spec) take any name.
    # No embed_scale: the claims name plain nn.Embedding, and a replicated Gemma3 embedding keeps its own forward.
    axes = {**COMMON_AXES, "head": ("lm_head", "model.lm_head", "output"), "padding": None, "embed_spec": None,
            "save": None}

    def claims(self, values):
        head = values["head"]
        return Claims(module_types={head: "Linear", "proj": "Linear", "embed_tokens": "Embedding"},
                      param_shards={"embed_tokens.weight": None, f"{head}.bias": None},
                      shared_params=((f"{head}.weight", "embed_tokens.weight"),),
                      reports_grad_norm=reports_grad_norm(values))


class TiedPlanHead(TiedColumnGatheredHead):
    name = "tied_plan_head"
    feature = "tied embedding / head"
    description = ("A tied head through the model's HF-style tp_plan (embedding_rowwise + colwise_gather_output), "
                   "vocab_parallel_lm_head unset or false: DeepSpeed's auto vocab-parallel path takes a head named "
                   "lm_head, and leaves one named output replicated and tied (the tie fallback).")
    axes = {**COMMON_AXES, "head": ("output", "lm_head"), "vocab_parallel_lm_head": ("unset", "false"), "padding": None,
            "second_head": None}
    defaults = {"head": "output"}

    def auto_vocab_parallel(self, values) -> bool:
        # DeepSpeed's tied-head test reads only these two names; two tied heads fall back to replicated heads
        # (docs/subjects.md#tied-heads).
        return (values["vocab_parallel_lm_head"] == "unset" and values["second_head"] == "none"
                and values["head"].split(".")[-1] in ("lm_head", "embed_out"))

    def invalid(self, values):
        if values["second_head"] != "none" and values["head"] != "lm_head":
            return "second_head: two heads qualify for the auto path only beside a head named lm_head"
        if self.auto_vocab_parallel(values) and values["reduction"] not in ("mean", "num_items"):
            return ("the auto path installs VocabParallelCausalLMLoss, which reduces to a mean or to a sum over "
                    "num_items_in_batch: 'none' and 'sum' are no reduction it offers")
        return super().invalid(values)

    def tensor_parallel_config(self, values):
        # No partition_config: a non-empty one, lm_head_patterns alone included, would take the engine off the plan.
        setting = values["vocab_parallel_lm_head"]
        return {} if setting == "unset" else {"vocab_parallel_lm_head": setting == "true"}

    def build(self, values, dtype):
        model = super().build(values, dtype)
        # DeepSpeed reads an instance's _tp_plan as an HF tp_plan (runtime/tensor_parallel/config.py _get_hf_tp_plan).
        model._tp_plan = {"embed_tokens": "embedding_rowwise", values["head"]: "colwise_gather_output"}
        second = values["second_head"]
        if second != "none":
            # A multi-token-prediction module's own head on the same tied Parameter, no bias: the model gains no
            # parameter, so the reference (which never calls it) is the same model.
            owner, leaf = second.split(".")
            model.add_module(owner, torch.nn.Module())
            spec = self.model_spec(values)
            extra = torch.nn.Linear(spec.hidden, spec.vocab, bias=False)
            extra.weight = model.embed_tokens.weight
            getattr(model, owner).add_module(leaf, extra)
        return model

    def claims(self, values):
        second = values["second_head"]
        if second != "none":
            both = super().claims(values)
            return dataclasses.replace(both, module_types={**both.module_types, second: "Linear"},
                                       shared_params=both.shared_params + ((f"{second}.weight", "embed_tokens.weight"),))
        if not self.auto_vocab_parallel(values):
            return super().claims(values)
        head = values["head"]
        return Claims(module_types={head: "VocabParallelLinear", "proj": "Linear", "embed_tokens": "VocabParallelEmbedding",
                                    "loss_function": "VocabParallelCausalLMLoss"},
                      param_shards={"embed_tokens.weight": 0, f"{head}.bias": 0},
                      micro_records={"logits": -1, "loss": None, "head_input_grad": None}, loss_backend="torch",
                      shared_params=((f"{head}.weight", "embed_tokens.weight"),),
                      reports_grad_norm=reports_grad_norm(values))
