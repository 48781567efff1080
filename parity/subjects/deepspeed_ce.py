"""DeepSpeed 0.19.8's vocabulary-parallel losses, called directly on vocabulary shards.

- ``ds_vocab_ce``: ``deepspeed.sequence.cross_entropy.vocab_parallel_cross_entropy`` (torch
  backend) on a slice of the logits, with explicit vocab_start_index/vocab_end_index from the
  suite's partition formula (so uneven vocabularies are allowed).
- ``ds_fused_linear_ce``: ``deepspeed.sequence.linear_cross_entropy.vocab_parallel_linear_cross_entropy``
  on a replicated hidden state and this rank's rows of the head weight (and bias), against an
  unfused linear + CE.

Both take a plain torch process group per TP size (``tp_group``, as the Liger subject does) and
DeepSpeed's comm layer joined to the worker's process group. Neither touches process-global
DeepSpeed state, so there is nothing to reset.
"""
from __future__ import annotations

import torch

from parity import collectives
from parity.observations import RankObservations
from parity.partition import shard_slice
from parity.subjects.base import Claims, Subject
from parity.subjects.deepspeed_autotp import setup_deepspeed
from parity.subjects.liger_ce import tp_group
from parity.tolerances import DTYPES
from references.cross_entropy import (ce_inputs, ce_reference, linear_ce_inputs, linear_ce_reference,
                                      upstream_objective)
from references.trajectory import TrainingSpec

SEED, TOKENS, IGNORE_INDEX = 4321, 24, -100
HIDDEN = 16  # fused linear+CE: hidden size of the head input (fixed; the head is not the subject's model)


def _bounds(vocab: int, tp: int, tp_rank: int) -> tuple[slice, int, int]:
    part = shard_slice(vocab, tp, tp_rank)
    return part, part.start, part.stop


class DeepSpeedVocabParallelCE(Subject):
    name = "ds_vocab_ce"
    description = "deepspeed.sequence.cross_entropy.vocab_parallel_cross_entropy on vocabulary shards"
    axes = {"dtype": None, "reduction": ("none", "sum", "mean"), "vocab": None, "ignore": None, "tp": None,
            "device": None}
    defaults = {"reduction": "none"}

    def claims(self, values):
        return Claims(module_types={}, param_shards={},
                      micro_records={"loss": None, "logits_grad": -1, "logits_after": -1},
                      exact_records=("logits_after",))

    def training_spec(self, values):
        return TrainingSpec(seed=SEED, steps=1, micro_batches=1, ignore=values["ignore"])

    def reference(self, values, compute_dtype=None):
        return ce_reference(SEED, TOKENS, values["vocab"], values["ignore"], DTYPES[values["dtype"]], compute_dtype,
                            IGNORE_INDEX, reduction=values["reduction"])

    def run_rank(self, values, ctx):
        from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy

        setup_deepspeed(ctx)
        tp, vocab, reduction = values["tp"], values["vocab"], values["reduction"]
        group = tp_group(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        part, start, end = _bounds(vocab, tp, tp_rank)
        logits, targets, upstream = ce_inputs(SEED, TOKENS, vocab, values["ignore"], DTYPES[values["dtype"]],
                                              IGNORE_INDEX)
        local = logits[:, part].to(ctx.device).contiguous().requires_grad_(True)
        with collectives.recording() as counts:
            loss = vocab_parallel_cross_entropy(local, targets.to(ctx.device), tp_group=group,
                                                vocab_start_index=start, vocab_end_index=end,
                                                ignore_index=IGNORE_INDEX, reduction=reduction, backend="torch")
            upstream_objective(loss, upstream.to(ctx.device), reduction).backward()
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        obs.facts["collectives"] = {(0, 0): dict(counts)}
        obs.record("loss", 0, 0, None, loss)
        obs.record("logits_grad", 0, 0, None, local.grad)
        obs.record("logits_after", 0, 0, None, local.detach())
        return obs


class DeepSpeedFusedLinearCE(Subject):
    name = "ds_fused_linear_ce"
    description = ("deepspeed.sequence.linear_cross_entropy.vocab_parallel_linear_cross_entropy on the head's "
                   "vocabulary rows against an unfused linear + CE")
    axes = {"dtype": None, "reduction": ("none", "sum", "mean"), "vocab": None, "bias": None, "chunk": None,
            "ignore": None, "tp": None, "device": None}

    def claims(self, values):
        records = {"loss": None, "hidden_grad": None, "weight_grad": 0}
        if values["bias"]:
            records["bias_grad"] = 0
        return Claims(module_types={}, param_shards={}, micro_records=records)

    def training_spec(self, values):
        return TrainingSpec(seed=SEED, steps=1, micro_batches=1, ignore=values["ignore"])

    def reference(self, values, compute_dtype=None):
        return linear_ce_reference(SEED, TOKENS, values["vocab"], HIDDEN, values["bias"], values["ignore"],
                                   DTYPES[values["dtype"]], compute_dtype, IGNORE_INDEX,
                                   reduction=values["reduction"])

    def run_rank(self, values, ctx):
        from deepspeed.sequence.linear_cross_entropy import vocab_parallel_linear_cross_entropy

        setup_deepspeed(ctx)
        tp, vocab, reduction = values["tp"], values["vocab"], values["reduction"]
        group = tp_group(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        part, start, end = _bounds(vocab, tp, tp_rank)
        h, w, b, targets, upstream = linear_ce_inputs(SEED, TOKENS, vocab, HIDDEN, values["bias"], values["ignore"],
                                                      DTYPES[values["dtype"]], IGNORE_INDEX)
        hidden = h.to(ctx.device).requires_grad_(True)
        weight = w[part].to(ctx.device).contiguous().requires_grad_(True)
        bias = None if b is None else b[part].to(ctx.device).contiguous().requires_grad_(True)
        with collectives.recording() as counts:
            loss = vocab_parallel_linear_cross_entropy(hidden, weight, targets.to(ctx.device), bias=bias,
                                                       tp_group=group, vocab_start_index=start, vocab_end_index=end,
                                                       ignore_index=IGNORE_INDEX, reduction=reduction,
                                                       chunk_size=values["chunk"] or None)
            upstream_objective(loss, upstream.to(ctx.device), reduction).backward()
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        obs.facts["collectives"] = {(0, 0): dict(counts)}
        obs.record("loss", 0, 0, None, loss)
        obs.record("hidden_grad", 0, 0, None, hidden.grad)
        obs.record("weight_grad", 0, 0, None, weight.grad)
        if bias is not None:
            obs.record("bias_grad", 0, 0, None, bias.grad)
        return obs

