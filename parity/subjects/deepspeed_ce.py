"""DeepSpeed 0.19.8's vocabulary-parallel losses, called directly on vocabulary shards over a plain torch TP
group; none touches process-global DeepSpeed state (docs/subjects.md#deepspeeds-vocabulary-parallel-losses)."""
from __future__ import annotations

import contextlib
import dataclasses
from importlib.util import find_spec

import torch

from parity.observe import collectives, gemm_dtypes
from parity.observe.observations import RankObservations
from parity.observe.partition import shard_slice
from parity.subjects.base import Claims, NoModel, Subject, case_seed
from parity.subjects.deepspeed_autotp import claimed_triton, expected_ce_backend, record_loss_backend, setup_deepspeed
from parity.subjects.loss_only import IGNORE_INDEX, SEED, TOKENS, LigerShards, LogitsCE, record_call, sp_group, tp_group
from parity.observe.dtypes import DTYPES
from references.cross_entropy import (ce_reference, linear_ce_inputs, linear_ce_reference, sequence_chunk, topk_index,
                                     upstream_objective)
from references.trajectory import TrainingSpec

HIDDEN = 16  # fused linear+CE: hidden size of the head input (fixed; the head is not the subject's model)
# Its tokens: 40, enough for the RMS and element-wise criteria (docs/subjects.md#the-fused-ces-token-count).
FUSED_TOKENS = 40


def global_vocab_size(values: dict) -> int | None:
    """The global_vocab_size a case passes (its ``global_vocab`` axis): None (not passed), the vocabulary, or one
    off either way, which DeepSpeed trusts (docs/subjects.md#deepspeeds-vocabulary-parallel-losses)."""
    vocab = values["vocab"]
    return {"unset": None, "exact": vocab, "under": vocab - 1, "over": vocab + 1}[values["global_vocab"]]


def autocast_dtype(values: dict):
    """The torch.autocast dtype a case's ``autocast`` axis names, or None (off)."""
    autocast = values["autocast"]
    return None if autocast == "off" else DTYPES[autocast]


def sequence_group(ctx, values):
    """The sp_group a case passes: None without sequence parallelism (DeepSpeed's default), else this rank's."""
    return sp_group(ctx, values["tp"], values["sp"]) if values["sp"] > 1 else None


def backend_recorded(obs, call, *args, triton: bool = False, **kwargs):
    """``call(*args, **kwargs)``, the CE backends it ran into obs.facts["loss_backend"]; triton: claimed_triton."""
    log: list = []
    with claimed_triton(triton), record_loss_backend(log):
        loss = call(*args, **kwargs)
    obs.facts["loss_backend"] = {(0, 0): log}
    return loss


class DeepSpeedVocabParallelCE(LogitsCE):
    """vocab_parallel_cross_entropy; with ``sp`` > 1 the call gets the SP group and ``gather_sequence_loss``, and
    must give the loss over the whole sequence's tokens (docs/subjects.md#tp-x-sp)."""

    name = "ds_vocab_ce"
    feature = None
    description = "deepspeed.sequence.cross_entropy.vocab_parallel_cross_entropy on vocabulary shards"
    axes = {"dtype": None, "reduction": ("none", "sum", "mean"), "vocab": None, "ignore": None, "tp": None,
            "sp": None, "seq_gather": None, "device": None, "backward": None, "global_vocab": None, "targets": None,
            "inf_rows": None, "ignore_index": None, "sp_chunks": None}
    defaults = {"reduction": "none"}

    def loss(self, values, ctx, local, targets, group, part, obs):
        from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy

        setup_deepspeed(ctx)
        return vocab_parallel_cross_entropy(local, targets, tp_group=group, sp_group=sequence_group(ctx, values),
                                            vocab_start_index=part.start, vocab_end_index=part.stop,
                                            global_vocab_size=global_vocab_size(values),
                                            ignore_index=self.ignore_index(values),
                                            reduction=values["reduction"],
                                            gather_sequence_loss=values["seq_gather"], backend="torch")


class DeepSpeedVocabSequenceParallelCE(LogitsCE):
    """vocab_sequence_parallel_cross_entropy, the sequence-parallel wrapper, on TP x SP blocks, held as ds_vocab_ce's
    SP cases are; its own defaults are the cases' (docs/subjects.md#tp-x-sp)."""

    name = "ds_vocab_seq_ce"
    feature = None
    description = ("deepspeed.sequence.cross_entropy.vocab_sequence_parallel_cross_entropy on the vocabulary shard "
                   "of a sequence chunk")
    axes = {"dtype": None, "reduction": ("none", "sum", "mean"), "vocab": None, "ignore": None, "tp": None,
            "sp": None, "seq_gather": None, "device": None, "sp_chunks": None}
    defaults = {"reduction": "none", "seq_gather": True}

    def loss(self, values, ctx, local, targets, group, part, obs):
        from deepspeed.sequence.cross_entropy import vocab_sequence_parallel_cross_entropy

        setup_deepspeed(ctx)
        return vocab_sequence_parallel_cross_entropy(local, targets, sequence_group(ctx, values), tp_group=group,
                                                     vocab_start_index=part.start, vocab_end_index=part.stop,
                                                     ignore_index=IGNORE_INDEX, reduction=values["reduction"],
                                                     gather_sequence_loss=values["seq_gather"], backend="torch")


class DeepSpeedVocabParallelCEModule(LogitsCE):
    """VocabParallelCrossEntropyLoss, the module wrapper, built with every argument set and called as
    ``module(logits, target)`` (docs/subjects.md#the-module-wrappers-arguments)."""

    name = "ds_vocab_ce_module"
    feature = None
    description = ("deepspeed.sequence.cross_entropy.VocabParallelCrossEntropyLoss (the module) with ignore_index, "
                   "reduction, shard bounds and backend passed through")
    axes = {"dtype": None, "reduction": ("none", "sum", "mean"), "vocab": None, "ignore": None,
            "ignore_index": None, "backend": None, "triton": None, "tp": None, "device": None}
    defaults = {"reduction": "none"}

    def _liger(self, values) -> bool:
        """Whether DeepSpeed's gate must pick Liger here; elsewhere "liger" falls back to torch, needing nothing."""
        return expected_ce_backend(values) == "liger"

    def requires(self, values):
        # Liger on CPU runs in Triton's interpreter (the rank worker sets TRITON_INTERPRET=1), as LigerShards says.
        interpreted = self._liger(values) and values["device"] == "cpu"
        return super().requires(values) + (["triton_interpreter"] if interpreted else [])

    def unavailable_reason(self, values):
        if self._liger(values) and find_spec("liger_kernel") is None:
            return "liger-kernel is not installed (pip install -e '.[liger]')"
        return super().unavailable_reason(values)

    def claims(self, values):
        return dataclasses.replace(super().claims(values), loss_backend=expected_ce_backend(values))

    def loss(self, values, ctx, local, targets, group, part, obs):
        from deepspeed.sequence.cross_entropy import VocabParallelCrossEntropyLoss

        setup_deepspeed(ctx)
        module = VocabParallelCrossEntropyLoss(tp_group=group, sp_group=None, vocab_start_index=part.start,
                                               vocab_end_index=part.stop, ignore_index=self.ignore_index(values),
                                               reduction=values["reduction"], gather_sequence_loss=False,
                                               backend=values["backend"])
        return backend_recorded(obs, module, local, targets, triton=values["triton"] == "claimed")


class DeepSpeedVocabParallelLogProbs(LogitsCE):
    """vocab_parallel_logprobs: each target's log-probability under vocabulary-sharded logits, held to -CE; with
    ``topk`` k a [tokens, k] index (docs/subjects.md#deepspeeds-vocabulary-parallel-losses)."""

    name = "ds_vocab_logprobs"
    feature = None
    description = ("deepspeed.sequence.vocab_parallel_ops.vocab_parallel_logprobs on vocabulary shards (its "
                   "negative: the per-token CE)")
    axes = {"dtype": None, "vocab": None, "ignore": None, "tp": None, "device": None, "topk": None, "inf_rows": None}

    def reference(self, values, compute_dtype=None):
        return ce_reference(case_seed(SEED, values), TOKENS, values["vocab"], values["ignore"],
                            DTYPES[values["dtype"]], compute_dtype, IGNORE_INDEX, topk=values["topk"],
                            inf_rows=values["inf_rows"])

    def loss(self, values, ctx, local, targets, group, part, obs):
        from deepspeed.sequence.vocab_parallel_ops import vocab_parallel_logprobs

        setup_deepspeed(ctx)
        k = values["topk"]
        index = topk_index(case_seed(SEED, values), targets.cpu(), values["vocab"], k, IGNORE_INDEX) if k else targets
        return -vocab_parallel_logprobs(local, index.to(local.device), tp_group=group, vocab_start_index=part.start,
                                        vocab_end_index=part.stop, ignore_index=IGNORE_INDEX)


class DeepSpeedVocabParallelEntropy(LogitsCE):
    """deepspeed.sequence.vocab_parallel_ops.vocab_parallel_entropy: each token's softmax entropy under
    vocabulary-sharded logits (RL's entropy bonus), against the entropy of the full logits."""

    name = "ds_vocab_entropy"
    feature = None
    description = "deepspeed.sequence.vocab_parallel_ops.vocab_parallel_entropy on vocabulary shards"
    axes = {"dtype": None, "vocab": None, "tp": None, "device": None, "inf_rows": None}
    measure = "entropy"

    def loss(self, values, ctx, local, targets, group, part, obs):
        from deepspeed.sequence.vocab_parallel_ops import vocab_parallel_entropy

        setup_deepspeed(ctx)
        return vocab_parallel_entropy(local, tp_group=group)


class DeepSpeedLigerGuardedCE(LigerShards, LogitsCE):
    """DeepSpeed's Liger backend of vocab_parallel_cross_entropy: Liger's kernel behind DeepSpeed's one-backward
    guard, through the gate or called directly (docs/subjects.md#deepspeeds-liger-backend)."""

    name = "ds_liger_ce"
    feature = None
    description = ("DeepSpeed's Liger CE backend (_liger_vocab_cross_entropy: Liger kernel + DeepSpeed's "
                   "one-backward guard) on equal vocabulary shards, per-token losses")
    axes = {"dtype": None, "vocab": None, "ignore": None, "tp": None, "device": None, "backward": None,
            "global_vocab": None, "triton": None}

    @staticmethod
    def gated(values) -> bool:
        """Whether the rank calls vocab_parallel_cross_entropy(backend="liger") (DeepSpeed's gate decides)."""
        return values["device"] == "cuda" or values["triton"] == "claimed"

    def needs_equal_shards(self, values):
        return not self.gated(values)

    def claims(self, values):
        claims = super().claims(values)
        if self.gated(values):
            equal = values["vocab"] % values["tp"] == 0
            claims = dataclasses.replace(claims, loss_backend="liger" if equal else "torch")
        return claims

    def loss(self, values, ctx, local, targets, group, part, obs):
        from deepspeed.sequence import cross_entropy as ce

        if not self.gated(values) and values["global_vocab"] != "unset":
            raise ValueError("ds_liger_ce: global_vocab needs the gated path (device cuda or triton claimed); "
                             "the direct _liger_vocab_cross_entropy call takes no global_vocab_size")
        setup_deepspeed(ctx)
        if not self.gated(values):
            obs.facts["loss_backend"] = {(0, 0): ["liger"]}
            return ce._liger_vocab_cross_entropy(local, targets, group, IGNORE_INDEX)
        return backend_recorded(obs, ce.vocab_parallel_cross_entropy, local, targets, tp_group=group,
                                vocab_start_index=part.start, vocab_end_index=part.stop,
                                global_vocab_size=global_vocab_size(values), ignore_index=IGNORE_INDEX,
                                reduction="none", backend="liger", triton=values["triton"] == "claimed")


class DeepSpeedLigerWithoutGroup(LogitsCE):
    """backend="liger" with tp_group=None, as a data-parallel job calls it: the torch CE must run on every rank
    (docs/subjects.md#deepspeeds-liger-backend)."""

    name = "ds_liger_no_group"
    feature = None
    description = "vocab_parallel_cross_entropy(backend='liger', tp_group=None) on full-vocabulary logits"
    axes = {"dtype": None, "vocab": None, "ignore": None, "tp": None, "device": None}

    def block(self, vocab, tp, tp_rank):
        return slice(0, vocab)  # no vocabulary split: each rank is a data-parallel replica

    def claims(self, values):
        return Claims(module_types={}, param_shards={}, loss_backend="torch",
                      micro_records={"loss": None, "logits_grad": None, "logits_after": None},
                      exact_records=("logits_after",))

    def loss(self, values, ctx, local, targets, group, part, obs):
        from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy

        setup_deepspeed(ctx)
        return backend_recorded(obs, vocab_parallel_cross_entropy, local, targets, tp_group=None,
                                ignore_index=IGNORE_INDEX, reduction="none", backend="liger")


class DeepSpeedFusedLinearCE(NoModel, Subject):
    framework = "deepspeed"
    name = "ds_fused_linear_ce"
    feature = None
    description = ("deepspeed.sequence.linear_cross_entropy.vocab_parallel_linear_cross_entropy on the head's "
                   "vocabulary rows against an unfused linear + CE")
    # autocast: the call made inside the user's torch.autocast on float32 inputs (the function reads the autocast
    # dtype as its compute dtype, linear_cross_entropy.py:258), against plain autocast's linear + CE.
    axes = {"dtype": None, "reduction": ("none", "sum", "mean"), "vocab": None, "bias": None, "chunk": None,
            "ignore": None, "tp": None, "sp": None, "device": None, "autocast": ("off", "bf16")}

    def invalid(self, values):
        sp = values["sp"]
        if values["autocast"] != "off" and values["dtype"] != "fp32":
            return "autocast runs on float32 inputs (dtype fp32), as a user's AMP loop"
        return f"sp {sp} does not split the {FUSED_TOKENS} tokens into equal chunks" if FUSED_TOKENS % sp else None

    def claims(self, values):
        records = {"loss": None, "hidden_grad": None, "weight_grad": 0}
        if values["bias"]:
            records["bias_grad"] = 0
        # bf16/fp16 and autocast: judged as a stage (one computation from exact inputs); fp32 keeps the
        # end-to-end slack. Why: docs/subjects.md#the-fused-ce-as-a-stage
        amp = autocast_dtype(values)
        return Claims(module_types={}, param_shards={}, micro_records=records,
                      stage_local=values["dtype"] in ("bf16", "fp16") or amp is not None,
                      gemm_dtype=None if amp is None else str(amp).replace("torch.", ""))

    def training_spec(self, values):
        return TrainingSpec(seed=case_seed(SEED, values), steps=1, micro_batches=1, ignore=values["ignore"])

    def reference(self, values, compute_dtype=None):
        return linear_ce_reference(case_seed(SEED, values), FUSED_TOKENS, values["vocab"], HIDDEN, values["bias"],
                                   values["ignore"],
                                   DTYPES[values["dtype"]], compute_dtype, IGNORE_INDEX,
                                   reduction=values["reduction"], sequence_parts=values["sp"],
                                   autocast=autocast_dtype(values))

    def run_rank(self, values, ctx):
        from deepspeed.sequence.linear_cross_entropy import vocab_parallel_linear_cross_entropy

        setup_deepspeed(ctx)
        tp, vocab, reduction = values["tp"], values["vocab"], values["reduction"]
        group = tp_group(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        part = shard_slice(vocab, tp, tp_rank)
        h, w, b, targets, upstream = linear_ce_inputs(case_seed(SEED, values), FUSED_TOKENS, vocab, HIDDEN, values["bias"],
                                                      values["ignore"],
                                                      DTYPES[values["dtype"]], IGNORE_INDEX)
        # Sequence parallelism: this rank's chunk of the tokens (dp_rank is its SP rank), the head replicated.
        rows = sequence_chunk(FUSED_TOKENS, values["sp"], dp_rank)
        h, targets, upstream = h[rows], targets[rows], upstream[rows]
        hidden = h.to(ctx.device).requires_grad_(True)
        weight = w[part].to(ctx.device).contiguous().requires_grad_(True)
        bias = None if b is None else b[part].to(ctx.device).contiguous().requires_grad_(True)
        amp = autocast_dtype(values)
        with collectives.recording() as counts, gemm_dtypes.recording(amp or DTYPES[values["dtype"]]) as gemms:
            # The user's AMP forward: the call inside torch.autocast, backward outside it.
            with (torch.autocast(ctx.device.split(":")[0], dtype=amp) if amp is not None else contextlib.nullcontext()):
                loss = vocab_parallel_linear_cross_entropy(hidden, weight, targets.to(ctx.device), bias=bias,
                                                           tp_group=group, sp_group=sequence_group(ctx, values),
                                                           vocab_start_index=part.start, vocab_end_index=part.stop,
                                                           ignore_index=IGNORE_INDEX, reduction=reduction,
                                                           chunk_size=values["chunk"] or None)
            upstream_objective(loss, upstream.to(ctx.device), reduction).backward()
        if values["sp"] > 1:
            # The head is replicated over the SP ranks: its gradient is summed over them, as a training
            # loop's step does (docs/subjects.md#tp-x-sp).
            import torch.distributed as dist

            for param in (weight, bias):
                if param is not None:
                    dist.all_reduce(param.grad, group=sequence_group(ctx, values))
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        obs.facts["gemm_dtypes"] = sorted(gemms)
        return record_call(obs, counts, loss=loss, hidden_grad=hidden.grad, weight_grad=weight.grad,
                           bias_grad=None if bias is None else bias.grad)

