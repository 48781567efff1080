"""How far DeepSpeed 0.19.8's AutoTP reaches for the output head when the user does not name it as the other
engine subjects do, on TinyLlamaModel with every block projection claimed (docs/subjects.md#the-heads-reach)."""
from __future__ import annotations

import dataclasses
import re
import types

from parity.subjects.base import NAMED_HEADS, head_claims, projection_claims
from parity.subjects.deepspeed_autotp import (COMMON_AXES, ColumnGatheredHead, EngineHead, reports_grad_norm,
                                              skip_proj_specs)

BLOCKS = 2  # two blocks of one class: the heuristic parser keeps one policy per block class, the walk meets both


class SpecReachHead(ColumnGatheredHead):
    name = "spec_reach"
    feature = None
    description = ("A gathered column spec meant for the head that DeepSpeed's matcher may leave unapplied: an "
                   "anchored pattern on a nested head, or model_types on a model with or without a config.model_type.")
    axes = {**COMMON_AXES, "reach": None}

    def head_spec(self, values: dict) -> dict:
        head, reach = values["head"], values["reach"]
        if reach == "anchored":
            if "." not in head:
                raise ValueError(f"reach 'anchored' needs a nested head (head = 'model.lm_head'), got head = {head!r}")
            # The head's own name, as a user who thinks of "the lm_head" writes it; re.match anchors it at the start.
            return {"patterns": [rf"{re.escape(head.split('.')[-1])}\.weight$"]}
        return {"patterns": [rf"{re.escape(head)}\.weight$"], "model_types": ["llama"]}

    def tensor_parallel_config(self, values):
        return skip_proj_specs({**self.head_spec(values), "partition_type": "column", "gather_output": True})

    def build(self, values, dtype):
        model = super().build(values, dtype)
        if values["reach"] == "model_types_config":
            # All AutoTP reads of a config here: model_type (_get_model_type); no head counts, so the shards stay
            # near-even. An HF model's PretrainedConfig carries the same attribute.
            model.config = types.SimpleNamespace(model_type="llama")
        return model


class LlamaBlocksHead(EngineHead):
    """TinyLlamaModel through the engine loop; subclasses say which of DeepSpeed's sources shards its blocks."""
    axes = {**COMMON_AXES, "vocab_parallel_lm_head": ("true", "false")}
    # The axis's own default, "unset", is the HF auto path's; here None acts as false (engine.py:1202), a twin of "false".
    defaults = {"vocab_parallel_lm_head": "true"}

    def model_spec(self, values):
        return dataclasses.replace(super().model_spec(values), blocks=BLOCKS)

    def invalid(self, values):
        # DeepSpeed's loss offers no 'sum' or 'none' (docs/subjects.md#the-heads-reach).
        if values["vocab_parallel_lm_head"] == "true" and values["reduction"] not in ("mean", "num_items"):
            return ("vocab_parallel_lm_head installs VocabParallelCausalLMLoss, which reduces to a mean or to a sum over "
                    "num_items_in_batch: 'none' and 'sum' are no reduction it offers (as the vocab_parallel subject's "
                    "reduction domain says)")
        return None

    def vocab_parallel(self, values) -> dict:
        return {"vocab_parallel_lm_head": values["vocab_parallel_lm_head"] == "true"}

    def claims(self, values):
        blocks, norm = projection_claims("layers", BLOCKS), reports_grad_norm(values)
        if values["vocab_parallel_lm_head"] == "true":
            return head_claims(values["head"], "VocabParallelLinear", 0, vocab_loss=True, blocks=blocks,
                               loss_backend="torch", reports_grad_norm=norm)
        # No source names the head: it stays the user's replicated nn.Linear, computing full logits on every rank.
        return head_claims(values["head"], "Linear", None, None, blocks=blocks, reports_grad_norm=norm)


class PresetLlamaHead(LlamaBlocksHead):
    name = "preset_llama"
    feature = None
    description = ("tensor_parallel.preset_model 'llama' on a Llama-shaped model of the user's own: the preset's "
                   "regexes shard the blocks; vocab_parallel_lm_head true makes the head VocabParallelLinear, false "
                   "leaves it a replicated nn.Linear (no preset spec names lm_head).")

    def tensor_parallel_config(self, values):
        return {"preset_model": "llama", **self.vocab_parallel(values)}


class HeuristicBlocksHead(LlamaBlocksHead):
    name = "heuristic_blocks"
    feature = None
    description = ("No partition_config and no tp_plan: AutoTP's heuristic parser shards the blocks (o_proj and "
                   "down_proj row, the rest column); vocab_parallel_lm_head true replaces the head by a separate "
                   "AutoTP, false leaves it a replicated nn.Linear.")

    # layers.1.lm_head: the head registered in a block, which the heuristic walk (replace_transformer_layer over the
    # ModuleList's block class) reaches, unlike a top-level head (inventory row "heuristic head routing").
    axes = {**LlamaBlocksHead.axes, "head": (*NAMED_HEADS, "layers.1.lm_head")}

    def tensor_parallel_config(self, values):
        return self.vocab_parallel(values)

    def claims(self, values):
        claims, head = super().claims(values), values["head"]
        if head.startswith("layers.") and values["vocab_parallel_lm_head"] == "false":
            # AutoTP._replace's training rule for a Linear whose last name segment is lm_head (auto_tp.py:449-472):
            # a column LinearLayer with gathered output, never the inference LmHeadLinearAllreduce.
            return dataclasses.replace(claims, module_types={**claims.module_types, head: "LinearLayer"},
                                       param_shards={**claims.param_shards, f"{head}.weight": 0, f"{head}.bias": 0})
        return claims
