"""DeepSpeed 0.19.8 untied VocabParallelEmbedding, built directly (no engine).

An untied embedding becomes vocabulary-parallel only by direct construction (notes, "(b) Direct
construction"): ``VocabParallelEmbedding(nn.Embedding, tp_group)`` in AutoTP training mode shards
the table along the vocabulary (dim 0) with its own shard sizes, looks up this rank's rows (other
tokens are remapped to row 0 and their output zeroed) and all-reduces the partial lookups. A
padding_idx survives only on the rank whose shard holds it, shifted to the local index.

The rank trains the table alone on references/embedding_lookup.py's task (lookup + squared error),
with its own SGD: torch.optim.SGD in fp32; in bf16 a float32 master copy updated the same way, as
DeepSpeed's bf16 optimizer does. Records: the full lookup (replicated after the all-reduce), the
loss, the weight shard's gradient and the weights after each update.

``embed_scale = "gemma3"``: the table is transformers' Gemma3TextScaledWordEmbedding (embed_scale sqrt(hidden)),
the one custom embedding forward VocabParallelEmbedding accepts; it copies the buffer and multiplies the reduced
lookup by it cast to the weight dtype, which must be what HF's unsharded forward gives, forward and gradient.
"""
from __future__ import annotations

import copy

import torch

from parity.observe import collectives
from parity.observe.observations import RankObservations
from parity.subjects.base import Claims, RankContext, Subject, padding_index
from parity.subjects.deepspeed_tied import gemma3_unavailable
from parity.subjects.deepspeed_autotp import CLEAN_STATE, install_tp_groups, reset_deepspeed_state, setup_deepspeed
from parity.observe.dtypes import DTYPES


def gemma3_scaled(table: torch.nn.Embedding) -> torch.nn.Embedding:
    """The same table as a user's Gemma3 model holds it: HF's class, built in float32 as from_pretrained builds it
    (the buffer sqrt(hidden) in float32), the weights loaded, then cast with the model to the table's dtype."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    vocab, hidden = table.weight.shape
    scaled = Gemma3TextScaledWordEmbedding(vocab, hidden, table.padding_idx, embed_scale=hidden ** 0.5)
    with torch.no_grad():
        scaled.weight.copy_(table.weight.float())
    return scaled.to(table.weight.dtype)


class DirectVocabParallelEmbedding(Subject):
    framework = "deepspeed"
    name = "vocab_parallel_embedding"
    feature = "vocab-parallel embedding"
    description = ("untied VocabParallelEmbedding built directly in AutoTP training mode: table sharded along "
                   "vocab, masked local lookup + all-reduce, trained alone on a summed squared-error lookup loss.")
    axes = {"dtype": ("fp32", "bf16"), "vocab": None, "hidden": None, "gas": None, "tp": None,
            "device": None, "padding": None, "embed_scale": None}
    clean_state = CLEAN_STATE

    def reference(self, values, compute_dtype=None):
        from references.embedding_lookup import train_lookup_reference

        return train_lookup_reference(values["vocab"], values["hidden"], padding_index(values),
                                      self.training_spec(values), DTYPES[values["dtype"]], compute_dtype,
                                      scaled=values.get("embed_scale", "none") == "gemma3")

    def unavailable_reason(self, values):
        return gemma3_unavailable(values) or super().unavailable_reason(values)

    def claims(self, values):
        return Claims(module_types={"embedding": "VocabParallelEmbedding"}, param_shards={"weight": 0},
                      micro_records={"embedding": None, "loss": None})

    def reset_process_state(self, ctx: RankContext) -> dict:
        setup_deepspeed(ctx)
        return reset_deepspeed_state()

    def run_rank(self, values: dict, ctx: RankContext) -> RankObservations:
        from deepspeed.module_inject.layers import VocabParallelEmbedding, set_autotp_mode
        from deepspeed.utils import groups

        from references.embedding_lookup import build_embedding, lookup_batch, lookup_loss

        setup_deepspeed(ctx)
        tp = values["tp"]
        install_tp_groups(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        train = self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        set_autotp_mode(training=True)  # else the layer's parameters are built with requires_grad=False
        table = build_embedding(values["vocab"], values["hidden"], padding_index(values), train.seed, dtype)
        if values.get("embed_scale", "none") == "gemma3":
            table = gemma3_scaled(table)
        layer = VocabParallelEmbedding(copy.deepcopy(table).to(ctx.device), groups.get_tensor_model_parallel_group(),
                                       name="embed_tokens")
        obs.facts["module_types"] = {"embedding": type(layer).__name__}
        weight = layer.weight
        obs.record("weight", -1, None, "weight", weight)
        if dtype == torch.float32:
            optimizer = torch.optim.SGD([weight], lr=train.lr)
        else:
            master = weight.detach().float().clone()
        for step in range(train.steps):
            weight.grad = None
            for micro in range(train.micro_batches):
                ids, target = lookup_batch(train, step, micro, values["vocab"], values["hidden"])
                with collectives.recording() as counts:
                    out = layer(ids.to(ctx.device))
                    loss = lookup_loss(out, target.to(ctx.device))
                    (loss / train.micro_batches).backward()
                obs.facts.setdefault("collectives", {})[(step, micro)] = dict(counts)
                obs.record("embedding", step, micro, None, out)
                obs.record("loss", step, micro, None, loss)
            grad = weight.grad.float()
            obs.record("grad", step, None, "weight", grad)
            with torch.no_grad():
                if dtype == torch.float32:
                    optimizer.step()
                else:
                    master.add_(grad, alpha=-train.lr)
                    weight.copy_(master.to(dtype))
            obs.record("weight", step, None, "weight", weight)
        return obs
