"""Liger-Kernel 0.8.5's LigerVocabParallelCEFunction, called directly on vocabulary shards.

On CUDA it runs Liger's Triton kernels; on CPU the rank worker sets TRITON_INTERPRET=1 so the same
kernels run in Triton's interpreter (small shapes only). Liger assumes equal shards
(vocab_start = rank * local_vocab): this subject only accepts vocabularies that TP divides.
"""
from __future__ import annotations

from importlib.util import find_spec

import torch

from parity import collectives
from parity.observations import RankObservations
from parity.partition import shard_sizes, shard_slice
from parity.subjects.base import Claims, RankContext, Subject
from parity.tolerances import DTYPES
from references.cross_entropy import ce_inputs, ce_reference
from references.trajectory import TrainingSpec

SEED, TOKENS, IGNORE_INDEX = 4321, 24, -100


def tp_group(ctx: RankContext, tp: int):
    """One process group per TP size, made once per process (new_group is collective and not free)."""
    import torch.distributed as dist

    groups = ctx.state.setdefault("plain_tp_groups", {})
    if tp not in groups:
        made = [dist.new_group(list(range(start, start + tp))) for start in range(0, ctx.world_size, tp)]
        groups[tp] = made[ctx.rank // tp]
    return groups[tp]


class LigerVocabParallelCE(Subject):
    name = "liger_vocab_ce"
    description = "LigerVocabParallelCEFunction on equal vocabulary shards against the suite's CE"
    axes = {"dtype": None, "vocab": None, "ignore": None, "tp": None, "device": None}

    def markers(self, values):
        return super().markers(values) + ["liger"]

    def unavailable_reason(self, values):
        if values["vocab"] % values["tp"]:
            return "Liger assumes equal vocabulary shards; this vocabulary does not divide by tp"
        if find_spec("liger_kernel") is None:
            return "liger-kernel is not installed (pip install -e '.[liger]')"
        return super().unavailable_reason(values)

    def claims(self, values):
        return Claims(module_types={}, param_shards={},
                      micro_records={"loss": None, "logits_grad": -1, "logits_after": -1},
                      exact_records=("logits_after",))

    def training_spec(self, values):
        return TrainingSpec(seed=SEED, steps=1, micro_batches=1, ignore=values["ignore"])

    def reference(self, values, compute_dtype=None):
        return ce_reference(SEED, TOKENS, values["vocab"], values["ignore"], DTYPES[values["dtype"]], compute_dtype,
                            IGNORE_INDEX)

    def run_rank(self, values, ctx):
        from liger_kernel.ops.vocab_parallel_cross_entropy import LigerVocabParallelCEFunction

        tp = values["tp"]
        group = tp_group(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        vocab = values["vocab"]
        local_vocab = shard_sizes(vocab, tp)[tp_rank]
        logits, targets, upstream = ce_inputs(SEED, TOKENS, vocab, values["ignore"], DTYPES[values["dtype"]],
                                              IGNORE_INDEX)
        local = logits[:, shard_slice(vocab, tp, tp_rank)].to(ctx.device).contiguous().requires_grad_(True)
        with collectives.recording() as counts:
            loss = LigerVocabParallelCEFunction.apply(local.view(TOKENS, 1, local_vocab),
                                                      targets.to(ctx.device).view(TOKENS, 1), group, IGNORE_INDEX,
                                                      0.0, "pytorch", "global").view(TOKENS)
            (loss * upstream.to(ctx.device, loss.dtype)).sum().backward()
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        obs.facts["collectives"] = {(0, 0): dict(counts)}
        obs.record("loss", 0, 0, None, loss)
        obs.record("logits_grad", 0, 0, None, local.grad)
        obs.record("logits_after", 0, 0, None, local.detach())
        return obs
