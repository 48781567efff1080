"""Planted bugs the suite must catch: a hand-written catalog of semantic mutants.

Generic mutation tools flip operators and constants; the bugs that matter in a tensor-parallel
head are "this all-reduce is missing", "this shard offset is wrong", "this denominator is local".
Each mutant here is one such bug, written as a small runtime patch of DeepSpeed 0.19.8 (or of the
suite's own references), and ``ci/mutation_check.py`` checks that the suite fails with it.

Where a mutant is applied matters:

- ``where="rank"``: DeepSpeed code runs only in the spawned rank processes. The parent sets
  ``PARITY_MUTANT=<name>`` before it creates a ``parity.runner.Runner``; every rank process of
  that runner inherits it and ``parity.rank_worker`` applies the patch once, at rank start.
- ``where="parent"``: the references (``references/``) are trained in the parent process by
  ``parity.compare.reference_pair``, so a reference mutant is applied there, in-process, and
  undone afterwards. It must NOT reach the ranks: the column-gathered subject computes its loss
  with the suite's own CE (``references.tiny_lm.causal_lm_loss``), so the same wrong CE on both
  sides would agree with itself and the mutant would survive for the wrong reason.

A mutant with ``equivalent`` set is one the current matrix cannot tell from the original, with
the reason; it is expected to survive, and one that is *killed* means the suite rejected a
correct implementation (a false alarm), which the mutation check also reports as a failure.

Every patched function mirrors the upstream code line for line except for the planted change,
so a mutant differs from DeepSpeed in exactly one way.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

ENV_VAR = "PARITY_MUTANT"
COLUMN, VOCAB = "column_gathered", "vocab_parallel"
FAMILIES = (COLUMN, VOCAB)


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str  # what it breaks
    replaces: str  # the upstream function it replaces (dotted path)
    observable: str  # the check expected to catch it
    families: tuple  # case families (subjects) it applies to
    patch: Callable[[], Callable[[], None]] = field(repr=False)  # applies; returns an undo
    where: str = "rank"  # "rank" (inside every rank process) or "parent" (where references run)
    equivalent: str | None = None  # why the current matrix cannot kill it, if it cannot

    def apply(self) -> Callable[[], None]:
        """Monkeypatch the target; returns a function that restores the original."""
        return self.patch()


def _swap(owner, attr: str, new) -> Callable[[], None]:
    old = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    setattr(owner, attr, new)
    return lambda: setattr(owner, attr, old)


def _layers():
    from deepspeed.module_inject import layers

    return layers


def _ce():
    import importlib

    return importlib.import_module("deepspeed.sequence.cross_entropy")


# -- ColumnParallel / GatherFromTensorParallelRegion / LinearLayer ------------------------------------

def _column_backward_no_allreduce():
    def backward(ctx, grad_output):
        return None, grad_output  # upstream all-reduces grad_output over ctx.group first

    return _swap(_layers().ColumnParallel, "backward", staticmethod(backward))


def _column_backward_world_group():
    layers = _layers()
    pg_utils, dist = layers.pg_utils, layers.dist

    def backward(ctx, grad_output):
        if not pg_utils.is_parallel(ctx.group):
            return None, grad_output
        dist.all_reduce(grad_output.contiguous())  # upstream: group=ctx.group
        return None, grad_output

    return _swap(layers.ColumnParallel, "backward", staticmethod(backward))


def _gather_backward_rank0_slice():
    def backward(ctx, grad_output):
        shard_offset = 0  # upstream: sum(ctx.partition_sizes[:ctx.tp_index])
        shard_size = ctx.partition_sizes[ctx.tp_index]
        grad_input = grad_output.narrow(-1, shard_offset, shard_size).contiguous()
        return None, grad_input, None

    return _swap(_layers().GatherFromTensorParallelRegion, "backward", staticmethod(backward))


def _gather_forward_reversed():
    layers = _layers()
    cls = layers.GatherFromTensorParallelRegion
    dist = layers.dist

    def forward(ctx, group, input, partition_sizes):
        ctx.group = group
        ctx.partition_sizes = partition_sizes
        ctx.tp_index = 0
        tp_world_size = len(partition_sizes)
        if group is None or tp_world_size == 1:
            return input
        ctx.tp_index = dist.get_rank(group=group)
        local_size = partition_sizes[ctx.tp_index]
        assert local_size == input.shape[-1]
        max_partition_size = max(partition_sizes)
        if local_size == max_partition_size:
            input_padded = input.contiguous()
        else:
            input_padded = input.new_zeros((*input.shape[:-1], max_partition_size))
            input_padded[..., :local_size].copy_(input)
        buffer = input.new_empty((tp_world_size * input_padded.shape[0], *input_padded.shape[1:]))
        dist.all_gather_into_tensor(buffer, input_padded, group=group)
        shards = buffer.view(tp_world_size, *input_padded.shape)
        # upstream concatenates shards 0..tp-1; this one tp-1..0
        return torch_cat([shards[i].narrow(-1, 0, size) for i, size in reversed(list(enumerate(partition_sizes)))])

    return _swap(cls, "forward", staticmethod(forward))


def torch_cat(tensors):
    import torch

    return torch.cat(tensors, dim=-1)


def _add_bias(times: int):
    def add_bias(input, bias):
        if bias is None:
            return input
        for _ in range(times):  # upstream adds it once (out of place in training mode)
            input = input + bias
        return input

    return lambda: _swap(_layers(), "add_bias", add_bias)


def _linear_weight_detached():
    layers = _layers()

    def forward(self, input):
        self._assert_compiled_if_deferred()
        if getattr(self, "mp_group", None) is not None and not self.defer_collectives_to_compiler:
            input = layers.ColumnParallel.apply(self.mp_group, input)
        output = input.matmul(self.weight.detach().transpose(-1, -2))  # upstream: self.weight
        if self.bias is not None:
            output = layers.add_bias(output, self.bias)
        if self.gather_output:
            output = layers.GatherFromTensorParallelRegion.apply(self.mp_group, output, self._partition_sizes)
        return output

    return _swap(layers.LinearLayer, "forward", forward)


# -- _VocabParallelCrossEntropy ---------------------------------------------------------------------

def _ce_forward(ctx, vocab_parallel_logits, target, tp_group, vocab_start_index, vocab_end_index, ignore_index, *,
                max_mode="allreduce", reduce_sum=True, reduce_target=True, start_shift=0):
    """Upstream _VocabParallelCrossEntropy.forward with switches for the planted changes."""
    import torch

    ce = _ce()
    dist, pg_utils = ce.dist, ce.pg_utils
    vocab_start_index = vocab_start_index + start_shift
    target = target.to(dtype=torch.long)
    logits = vocab_parallel_logits.float()
    local_vocab_size = logits.shape[-1]

    local_max = logits.amax(dim=-1)
    global_max = local_max.clone()
    if pg_utils.is_parallel(tp_group):
        if max_mode == "allreduce":
            dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=tp_group)
        elif max_mode == "rank0":
            dist.broadcast(global_max, src=dist.get_global_rank(tp_group, 0), group=tp_group)
        # max_mode == "local": no collective, each rank shifts by its own max

    exp_logits = torch.exp(logits - global_max.unsqueeze(-1))
    global_sum_exp = exp_logits.sum(dim=-1)
    if reduce_sum and pg_utils.is_parallel(tp_group):
        dist.all_reduce(global_sum_exp, op=dist.ReduceOp.SUM, group=tp_group)

    valid_target = target != ignore_index
    target_in_partition = valid_target & (target >= vocab_start_index) & (target < vocab_end_index)
    local_target = (target - vocab_start_index).clamp(min=0, max=local_vocab_size - 1)
    target_logits = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
    target_logits = torch.where(target_in_partition, target_logits, torch.zeros_like(target_logits))
    if reduce_target and pg_utils.is_parallel(tp_group):
        dist.all_reduce(target_logits, op=dist.ReduceOp.SUM, group=tp_group)

    loss = torch.log(global_sum_exp) + global_max - target_logits
    loss = torch.where(valid_target, loss, torch.zeros_like(loss))

    ctx.save_for_backward(exp_logits, global_sum_exp, local_target, target_in_partition, valid_target)
    ctx.logits_dtype = vocab_parallel_logits.dtype
    return loss


def _ce_forward_mutant(**switches):
    def patch():
        def forward(ctx, vocab_parallel_logits, target, tp_group, vocab_start_index, vocab_end_index, ignore_index):
            return _ce_forward(ctx, vocab_parallel_logits, target, tp_group, vocab_start_index, vocab_end_index,
                               ignore_index, **switches)

        return _swap(_ce()._VocabParallelCrossEntropy, "forward", staticmethod(forward))

    return patch


def _ce_backward_no_target_term():
    def backward(ctx, grad_output):
        exp_logits, global_sum_exp, local_target, target_in_partition, valid_target = ctx.saved_tensors
        grad_logits = exp_logits / global_sum_exp.unsqueeze(-1)
        # upstream subtracts 1 at the target (scatter_add_ of -target_in_partition) here
        grad_logits *= valid_target.unsqueeze(-1).to(dtype=grad_logits.dtype)
        grad_logits *= grad_output.to(dtype=grad_logits.dtype).unsqueeze(-1)
        return grad_logits.to(dtype=ctx.logits_dtype), None, None, None, None, None

    return _swap(_ce()._VocabParallelCrossEntropy, "backward", staticmethod(backward))


def _ce_mean_counts_ignored():
    ce = _ce()
    original = ce.vocab_parallel_cross_entropy

    def vocab_parallel_cross_entropy(vocab_parallel_logits, target, *args, reduction="mean", **kwargs):
        if reduction != "mean":
            return original(vocab_parallel_logits, target, *args, reduction=reduction, **kwargs)
        loss_sum = original(vocab_parallel_logits, target, *args, reduction="sum", **kwargs)
        # upstream divides by (target != ignore_index).sum(): the ignored tokens are not counted
        return loss_sum / max(target.numel(), 1)

    return _swap(ce, "vocab_parallel_cross_entropy", vocab_parallel_cross_entropy)


def _causal_loss_ignores_num_items():
    cls = _ce().VocabParallelCausalLMLoss
    original = cls.__call__

    def __call__(self, logits, labels=None, vocab_size=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        # upstream: sum / num_items_in_batch when given one; this one always takes the local mean
        return original(self, logits, labels=labels, vocab_size=vocab_size, shift_labels=shift_labels,
                        num_items_in_batch=None, **kwargs)

    return _swap(cls, "__call__", __call__)


# -- the suite's own references (parent process) ------------------------------------------------------

def _reference_no_causal_shift():
    import references.tiny_lm as tiny_lm
    from references import loss as ref_loss

    def causal_lm_loss(logits, labels, reduction="mean", ignore_index=-100, num_items_in_batch=None):
        # upstream (references/loss.py): logits[..., :-1, :] predict labels[..., 1:]
        losses = ref_loss.token_losses(logits, labels, ignore_index)
        if reduction == "none":
            return losses[..., 1:]  # keep the [B, T-1] shape, so only the values can give it away
        total = losses.sum()
        if reduction == "sum":
            return total
        if reduction == "num_items":
            return total / max(int(num_items_in_batch), 1)
        return total / (labels != ignore_index).sum().clamp_min(1)

    return _swap(tiny_lm, "causal_lm_loss", causal_lm_loss)


def _reference_grad_not_divided_by_gas():
    import references.trajectory as trajectory

    original = trajectory._scalar

    def scalar(loss, reduction):
        value = original(loss, reduction)
        return _NoDivide(value)

    return _swap(trajectory, "_scalar", scalar)


class _NoDivide:
    """Wraps the loss so that '/ micro_batches' in train_reference is a no-op."""

    def __init__(self, value):
        self.value = value

    def __truediv__(self, _):  # upstream: (loss / micro_batches).backward()
        return self.value


MUTANTS = [
    Mutant("column_backward_no_allreduce",
           "ColumnParallel.backward returns the local input gradient without its all-reduce: the gradient "
           "reaching the head input misses the other shards' terms",
           "deepspeed.module_inject.layers.ColumnParallel.backward", "head_input_grad", (COLUMN, VOCAB),
           _column_backward_no_allreduce),
    Mutant("column_backward_world_group",
           "ColumnParallel.backward all-reduces over the default (world) group instead of ctx.group",
           "deepspeed.module_inject.layers.ColumnParallel.backward", "head_input_grad", (COLUMN,),
           _column_backward_world_group,
           equivalent="every case runs tp=2 on a world of 2 (dp=1), so the world group IS the TP group; "
                      "only a DP x TP case (world 4, tp 2) can tell"),
    Mutant("gather_backward_rank0_slice",
           "GatherFromTensorParallelRegion.backward narrows the gathered gradient at offset 0 on every rank: "
           "rank 1 trains its shard with rank 0's logit gradient",
           "deepspeed.module_inject.layers.GatherFromTensorParallelRegion.backward",
           "head_input_grad (all-reduced, so on every rank); grad[head.weight] on rank 1",
           (COLUMN,), _gather_backward_rank0_slice),
    Mutant("gather_forward_reversed",
           "GatherFromTensorParallelRegion.forward concatenates the shards in reverse rank order",
           "deepspeed.module_inject.layers.GatherFromTensorParallelRegion.forward", "logits", (COLUMN,),
           _gather_forward_reversed),
    Mutant("bias_not_added", "add_bias returns the matmul output without the (sharded) bias",
           "deepspeed.module_inject.layers.add_bias", "logits (bias cases)", (COLUMN, VOCAB), _add_bias(0)),
    Mutant("bias_added_twice", "add_bias adds the (sharded) bias twice",
           "deepspeed.module_inject.layers.add_bias", "logits (bias cases)", (COLUMN, VOCAB), _add_bias(2)),
    Mutant("linear_weight_detached",
           "LinearLayer.forward multiplies by weight.detach(): the head's weight gets no gradient and never trains",
           "deepspeed.module_inject.layers.LinearLayer.forward", "grad[lm_head.weight] / grad_nonzero",
           (COLUMN, VOCAB), _linear_weight_detached),
    Mutant("ce_local_max",
           "_VocabParallelCrossEntropy shifts by each rank's local max (MAX all-reduce dropped): the shards' "
           "exp-sums are added at different scales and the loss adds back a rank-dependent max",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss",
           (VOCAB,), _ce_forward_mutant(max_mode="local")),
    Mutant("ce_rank0_max",
           "_VocabParallelCrossEntropy shifts by TP rank 0's local max (broadcast) instead of the global max",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss", (VOCAB,),
           _ce_forward_mutant(max_mode="rank0"),
           equivalent="softmax is shift-invariant: any shift that is the same on every rank gives the same "
                      "loss and gradient; it only loses the overflow guard, which the tiny model's logits "
                      "(|logit| < 2) never need"),
    Mutant("ce_local_sum_exp",
           "_VocabParallelCrossEntropy uses the local sum of exp as the softmax denominator (SUM all-reduce dropped)",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss",
           (VOCAB,), _ce_forward_mutant(reduce_sum=False)),
    Mutant("ce_target_logit_not_reduced",
           "_VocabParallelCrossEntropy drops the all-reduce of the predicted (target) logit: ranks that do not own "
           "the target use 0",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss",
           (VOCAB,), _ce_forward_mutant(reduce_target=False)),
    Mutant("ce_vocab_start_off_by_one",
           "_VocabParallelCrossEntropy uses vocab_start_index + 1: the first target of each shard belongs to no "
           "rank and the others are looked up one column to the left",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss",
           (VOCAB,), _ce_forward_mutant(start_shift=1)),
    Mutant("ce_backward_no_target_term",
           "_VocabParallelCrossEntropy.backward returns softmax without subtracting the one-hot target",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.backward", "head_input_grad",
           (VOCAB,), _ce_backward_no_target_term),
    Mutant("ce_mean_counts_ignored",
           "vocab_parallel_cross_entropy's mean divides by every token, ignored ones included",
           "deepspeed.sequence.cross_entropy.vocab_parallel_cross_entropy", "loss (mean, scattered ignores)",
           (VOCAB,), _ce_mean_counts_ignored),
    Mutant("causal_loss_ignores_num_items",
           "VocabParallelCausalLMLoss drops num_items_in_batch and returns the micro-batch mean",
           "deepspeed.sequence.cross_entropy.VocabParallelCausalLMLoss.__call__", "loss (num_items)",
           (VOCAB,), _causal_loss_ignores_num_items),
    Mutant("reference_no_causal_shift",
           "the suite's reference CE forgets the causal shift (logits[t] scored against labels[t])",
           "references.tiny_lm.causal_lm_loss", "loss", (COLUMN, VOCAB), _reference_no_causal_shift,
           where="parent"),
    Mutant("reference_grad_not_divided_by_gas",
           "the reference backpropagates each micro-batch loss without dividing by the accumulation count",
           "references.trajectory._scalar", "head_input_grad / grad", (COLUMN, VOCAB),
           _reference_grad_not_divided_by_gas, where="parent"),
]
BY_NAME = {m.name: m for m in MUTANTS}


def get(name: str) -> Mutant:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(BY_NAME)}") from None


def apply_from_env(where: str = "rank"):
    """Called once at rank start: apply PARITY_MUTANT if it names a mutant of this process kind."""
    name = os.environ.get(ENV_VAR, "").strip()
    if not name:
        return None
    mutant = get(name)
    if mutant.where != where:
        return None
    mutant.apply()
    print(f"=== mutant applied: {mutant.name} ({mutant.replaces})", flush=True)
    return mutant
