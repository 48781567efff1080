"""DeepSpeed 0.19.8 untied VocabParallelEmbedding, built directly (no engine) and trained alone on
references/embedding_lookup.py's task (docs/subjects.md#untied-vocab-parallel-embedding)."""
from __future__ import annotations

import copy
import types

import torch

from parity.observe.observations import RankObservations
import parity.subjects.driver as driver  # the module, not the package: no import cycle
from parity.subjects.plain_sgd import PlainSGD
from parity.subjects.base import Claims, RankContext, padding_index
from parity.subjects.deepspeed_tied import gemma3_embedding, gemma3_unavailable
from parity.subjects.deepspeed_autotp import DeepSpeedSubject, install_tp_groups, setup_deepspeed
from parity.observe.dtypes import DTYPES


def gemma3_scaled(table: torch.nn.Embedding) -> torch.nn.Embedding:
    """The same table as a user's Gemma3 model holds it: HF's class, built in float32 as from_pretrained builds it
    (the buffer sqrt(hidden) in float32), the weights loaded, then cast with the model to the table's dtype."""
    scaled = gemma3_embedding(table)
    with torch.no_grad():
        scaled.weight.copy_(table.weight.float())
    return scaled.to(table.weight.dtype)


class DirectVocabParallelEmbedding(DeepSpeedSubject):
    name = "vocab_parallel_embedding"
    feature = "vocab-parallel embedding"
    description = ("untied VocabParallelEmbedding built directly in AutoTP training mode: table sharded along "
                   "vocab, masked local lookup + all-reduce, trained alone on a summed squared-error lookup loss.")
    axes = {"dtype": ("fp32", "bf16"), "vocab": None, "hidden": None, "gas": None, "tp": None,
            "device": None, "padding": None, "embed_scale": None}

    def reference(self, values, compute_dtype=None):
        from references.embedding_lookup import train_lookup_reference

        return train_lookup_reference(values["vocab"], values["hidden"], padding_index(values),
                                      self.training_spec(values), DTYPES[values["dtype"]], compute_dtype,
                                      scaled=values["embed_scale"] == "gemma3")

    def unavailable_reason(self, values):
        return gemma3_unavailable(values) or super().unavailable_reason(values)

    def claims(self, values):
        return Claims(module_types={"embedding": "VocabParallelEmbedding"}, param_shards={"weight": 0},
                      micro_records={"embedding": None, "loss": None})

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
        if values["embed_scale"] == "gemma3":
            table = gemma3_scaled(table)
        layer = VocabParallelEmbedding(copy.deepcopy(table).to(ctx.device), groups.get_tensor_model_parallel_group(),
                                       name="embed_tokens")
        # The layer's class and its own vocab range, TP index and size (structure[embedding.*]); the driver adds the
        # table's local shape.
        driver.record_structure(obs, types.SimpleNamespace(embedding=layer), self.claims(values))

        def batches(step):
            return [lookup_batch(train, step, micro, values["vocab"], values["hidden"])
                    for micro in range(train.micro_batches)], None

        def forward(batch, num_items):
            ids, target = batch
            out = layer(ids.to(ctx.device))
            return lookup_loss(out, target.to(ctx.device)), out

        params = {"weight": layer.weight}
        update = driver.PlainUpdate(layer, params, LookupSGD(params, dtype, train.lr))
        return driver.train(driver.Run(obs, train, forward, update, batches, output_kind="embedding", captured=None,
                                       record_collectives=True))


class LookupSGD(PlainSGD):
    """PlainSGD with the table's bf16 master stepped as ``master.add_(grad, alpha=-lr)`` (one fused multiply-add),
    as this subject has always stepped it; it records no master."""

    def masters(self) -> dict:
        return {}

    def step(self, grads: dict) -> None:
        if self.master is None:
            return super().step(grads)
        with torch.no_grad():
            for name, p in self.params.items():
                self.master[name].add_(grads[name], alpha=-self.lr)
                p.copy_(self.master[name].to(p.dtype))
