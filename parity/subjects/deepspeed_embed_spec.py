"""DeepSpeed 0.19.8 AutoTP with an explicit partition_config spec on an UNTIED input embedding
(docs/subjects.md#untied-embedding-spec)."""
from __future__ import annotations

import dataclasses

from parity.subjects.base import Claims, padding_index
from parity.subjects.deepspeed_autotp import COMMON_AXES, ColumnGatheredHead, reports_grad_norm
from parity.subjects.deepspeed_tied import Gemma3Embedding, embed_specs


class EmbeddingSpecHead(Gemma3Embedding, ColumnGatheredHead):
    name = "embed_spec_untied"
    feature = None
    description = ("an untied embed_tokens matched by a partition_config spec (hidden-sliced by AutoTP), proj as "
                   "row-parallel LinearAllreduce, lm_head column-gathered; padding_idx and clipping must survive.")
    axes = {**COMMON_AXES, "head": ("lm_head",), "padding": None, "embed_spec": ("row", "column"),
            "embedding_dim": None, "embed_scale": None, "grad_freq": None, "max_norm": None}
    defaults = {"embed_spec": "row"}

    def model_spec(self, values):
        max_norm = values["max_norm"]
        return dataclasses.replace(super().model_spec(values), padding_idx=padding_index(values),
                                   embed_scale=values["embed_scale"] == "gemma3",
                                   scale_grad_by_freq=values["grad_freq"], max_norm=max_norm or None)

    def tensor_parallel_config(self, values):
        dim = values["embedding_dim"]
        return {"partition_config": {"use_default_specs": False, **({} if dim == "unset" else
                                                                   {"embedding_partition_dim": dim}),
                                     "layer_specs": [
            *embed_specs(values),
            {"patterns": [r"proj\.weight$"], "partition_type": "skip" if vocab_sharded(values) else "row"},
            {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True},
        ]}}

    def claims(self, values):
        if vocab_sharded(values):
            # What embedding_partition_dim 0 asks for: the table's vocabulary rows split over the TP ranks, the
            # lookup whole on every rank (a replicated proj reads it), as a vocabulary-parallel embedding does.
            return Claims(module_types={"lm_head": "LinearLayer", "proj": "Linear"},
                          param_shards={"lm_head.weight": 0, "lm_head.bias": 0, "embed_tokens.weight": 0},
                          reports_grad_norm=reports_grad_norm(values))
        return Claims(module_types={"lm_head": "LinearLayer", "proj": "LinearAllreduce", "embed_tokens": "Embedding"},
                      param_shards={"lm_head.weight": 0, "lm_head.bias": 0, "embed_tokens.weight": 1,
                                    "proj.weight": 1, "proj.bias": None},
                      reports_grad_norm=reports_grad_norm(values))


def vocab_sharded(values: dict) -> bool:
    """partition_config.embedding_partition_dim 0: the embedding split along its vocabulary rows."""
    return values["embedding_dim"] == 0
