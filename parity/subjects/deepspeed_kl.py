"""DeepSpeed 0.19.8's vocab_parallel_kl_div on vocabulary shards (``ds_vocab_kl``), against the per-token KL of
the full logits (docs/subjects.md#vocabulary-parallel-kl)."""
from __future__ import annotations

import torch

from parity.observe import collectives
from parity.observe.dtypes import DTYPES
from parity.observe.observations import RankObservations
from parity.observe.partition import shard_slice
from parity.subjects.base import Claims, NoModel, Subject, case_seed
from parity.subjects.deepspeed_autotp import setup_deepspeed
from parity.subjects.loss_only import SEED, TOKENS, record_call, tp_group
from references.kl_div import kl_inputs, kl_reference
from references.trajectory import TrainingSpec


def teacher_columns(vocab: int, tp: int, tp_rank: int, layout: str) -> torch.Tensor:
    """The vocabulary ids of the teacher block this rank hands DeepSpeed: the student's own ("same"),
    each one moved one column on (mod vocab; every rank keeps its width: "shifted"), or the block of
    TP rank tp-1-r ("reversed": the widths differ where the split is uneven)."""
    if layout == "reversed":
        tp_rank = tp - 1 - tp_rank
    part = shard_slice(vocab, tp, tp_rank)
    ids = torch.arange(part.start, part.stop)
    return (ids + 1) % vocab if layout == "shifted" else ids


class DeepSpeedVocabParallelKL(NoModel, Subject):
    framework = "deepspeed"
    name = "ds_vocab_kl"
    feature = None
    description = ("deepspeed.sequence.vocab_parallel_ops.vocab_parallel_kl_div (forward / reverse) on vocabulary "
                   "shards, against the per-token KL of the full logits")
    axes = {"dtype": None, "reverse": None, "vocab": None, "kl_grad": None, "kl_shards": None, "tp": None,
            "device": None, "inf_rows": None}

    def claims(self, values):
        grad = values["kl_grad"]
        records = {"loss": None}
        if grad in ("student", "both"):
            records["student_grad"] = -1
        if grad in ("teacher", "both"):
            records["teacher_grad"] = -1
        records.update(student_after=-1, teacher_after=-1)
        return Claims(module_types={}, param_shards={}, micro_records=records,
                      exact_records=("student_after", "teacher_after"))

    def invalid(self, values):
        if values["inf_rows"] == "masked" and values["vocab"] < 3:
            # At vocabulary 2 the masked ids would mask a teacher row whole (docs/subjects.md#vocabulary-parallel-kl).
            return "inf_rows 'masked' needs a vocabulary of at least 3 (it masks ids 0-2 and V-2, V-1 on single rows)"
        return super().invalid(values)

    def training_spec(self, values):
        return TrainingSpec(seed=case_seed(SEED, values), steps=1, micro_batches=1, ignore="none")

    def reference(self, values, compute_dtype=None):
        return kl_reference(case_seed(SEED, values), TOKENS, values["vocab"], values["reverse"],
                            values["kl_grad"], DTYPES[values["dtype"]], compute_dtype,
                            values["inf_rows"])

    def run_rank(self, values, ctx):
        from deepspeed.sequence.vocab_parallel_ops import vocab_parallel_kl_div

        setup_deepspeed(ctx)
        tp, vocab, grad = values["tp"], values["vocab"], values["kl_grad"]
        group = tp_group(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        student, teacher, upstream = kl_inputs(case_seed(SEED, values), TOKENS, vocab, DTYPES[values["dtype"]],
                                               values["inf_rows"])
        part = shard_slice(vocab, tp, tp_rank)
        local_s = student[:, part].to(ctx.device).contiguous().requires_grad_(grad in ("student", "both"))
        columns = teacher_columns(vocab, tp, tp_rank, values["kl_shards"])
        local_t = teacher[:, columns].to(ctx.device).contiguous().requires_grad_(grad in ("teacher", "both"))
        with collectives.recording() as counts:
            loss = vocab_parallel_kl_div(local_s, local_t, reverse=values["reverse"], tp_group=group)
            (loss * upstream.to(ctx.device, loss.dtype)).sum().backward()
        return record_call(RankObservations(ctx.rank, tp_rank, dp_rank), counts, loss=loss,
                           student_grad=local_s.grad if local_s.requires_grad else None,
                           teacher_grad=local_t.grad if local_t.requires_grad else None,
                           student_after=local_s.detach(), teacher_after=local_t.detach())
