"""Planted bugs the suite must catch: a hand-written catalog of semantic mutants.

Generic mutation tools flip operators and constants; the bugs that matter in a tensor-parallel
head are "this all-reduce is missing", "this shard offset is wrong", "this denominator is local".
Each mutant here is one such bug, written as a small runtime patch of DeepSpeed 0.19.8 (or of the
suite's own references), and ``ci/mutation_check.py`` (parity/mutants.py) checks that the suite fails with it.

Where a mutant is applied matters:

- ``where="rank"``: DeepSpeed code runs only in the spawned rank processes. The parent gives a
  ``parity.harness.runner.Runner`` run settings naming the mutant (``RunSettings.mutant``, from
  ``PARITY_MUTANT=<name>``); every rank process of that runner is started with it and
  ``parity.harness.rank_worker`` applies the patch once, at rank start.
- ``where="parent"``: the references (``references/``) are trained in the parent process by
  ``parity.checks.compare.reference_pair``, so a reference mutant is applied there, in-process, and
  undone afterwards. It must NOT reach the ranks: the column-gathered subject computes its loss
  with the suite's own CE (``references.tiny_lm.causal_lm_loss``), so the same wrong CE on both
  sides would agree with itself and the mutant would survive for the wrong reason.

A mutant with ``equivalent`` set (one: ``fused_ce_hidden_grad_in_input_dtype``) is one the current matrix cannot tell from the
original, with the reason; it is expected to survive, and one that is *killed* means the suite rejected a
correct implementation (a false alarm), which the mutation check also reports as a failure.

Every patched function mirrors the upstream code line for line except for the planted change,
so a mutant differs from DeepSpeed in exactly one way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from parity.settings import MUTANT_VAR

ENV_VAR = MUTANT_VAR  # PARITY_MUTANT
# The families (subject names) the mutants below break; families() says which families there are.
COLUMN, VOCAB = "column_gathered", "vocab_parallel"
ROW, TIED_ROW, TIED_VOCAB = "row_parallel", "tied_row_parallel", "tied_vocab_parallel"
TIED_COLUMN = "tied_column_gathered"  # a gathered column spec on a tied head: AutoTP's replicated tie fallback
TIED_PLAN = "tied_plan_head"  # a tied head through an HF-style tp_plan: the tie fallback, or the auto vocab-parallel head
EMBED, DS_CE, FUSED_CE, LIGER_CE = "vocab_parallel_embedding", "ds_vocab_ce", "ds_fused_linear_ce", "liger_vocab_ce"
D_COLUMN, D_VOCAB, D_ROW = "direct_column_gathered", "direct_vocab_parallel", "direct_row_parallel"
DS_LIGER, INFERENCE, REJECT = "ds_liger_ce", "inference_head", "ds_reject"
DS_LIGER_NO_GROUP = "ds_liger_no_group"
HF_COLUMN, HF_ROW, HF_TIED = "hf_plan_column", "hf_plan_row", "hf_plan_tied"
T_COLUMN, T_VOCAB, T_ROW = "torch_column_gathered", "torch_vocab_parallel", "torch_row_parallel"
T_EMBED = "torch_vocab_embedding"
DS_LOGPROBS, DS_ENTROPY = "ds_vocab_logprobs", "ds_vocab_entropy"
DS_KL, DS_CE_MODULE = "ds_vocab_kl", "ds_vocab_ce_module"
DS_SEQ_CE = "ds_vocab_seq_ce"
# The head-selection subjects (parity/subjects/deepspeed_reach.py): a gathered column head picked by a restricted spec,
# and Llama-shaped models whose blocks AutoTP shards (by preset or heuristic) beside a vocabulary-parallel head.
SPEC_REACH, PRESET, HEURISTIC = "spec_reach", "preset_llama", "heuristic_blocks"
EMBED_SPEC = "embed_spec_untied"  # its head is the gathered column LinearLayer
M_COLUMN, M_VOCAB, M_EMBED = "megatron_column_gathered", "megatron_vocab_parallel", "megatron_vocab_embedding"
# The universal-checkpoint resumes (parity/subjects/deepspeed_universal.py): each engine head saved, converted, resumed.
UC_COLUMN, UC_VOCAB, UC_ROW = "uc_column_gathered", "uc_vocab_parallel", "uc_row_parallel"
# The transformers architectures through AutoTP (parity/subjects/zoo.py): column-sharded attention and MLP, and a
# gathered column or vocabulary-parallel head.
ZOO_PLAN, ZOO_VOCAB = "zoo_hf_plan", "zoo_vocab_parallel"
# The same architectures through AutoTP's heuristic parser (plan removed) and through a preset_model.
ZOO_HEURISTIC, ZOO_PRESET = "zoo_heuristic", "zoo_preset"
# The same architectures through transformers' own tensor parallelism (parity/subjects/zoo_transformers_tp.py): its
# rowwise layers and vocabulary-parallel embedding end in DTensor's Partial -> Replicate.
ZOO_TRANSFORMERS = "zoo_transformers_tp"


def families() -> tuple:
    """The case families, one per subject (a family is a subject's name), in registry order: every subject of the
    parity.subjects package (each has at least one mutant: tests/observe/test_collectives.py), and a subject added
    through PARITY_SUBJECT_MODULES where a registered mutant names it (one without, such as a deliberately broken
    self-test subject, is no family)."""
    from parity.subjects import SUBJECTS

    named = {f for m in MUTANTS for f in m.families}
    return tuple(n for n, s in SUBJECTS.items() if type(s).__module__.startswith("parity.subjects.") or n in named)


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
    # The cases of its families' selections that can kill it, where only some can (a mutant of fp16 dynamic loss
    # scaling: a static scale never overflows); where none of them runs on this machine its cells are "not run
    # here", not "survived" (they were judged on the H200 host's Xeon: results/h200-loss-scale).
    cases: tuple = ()

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

def _partition_row_moved():
    """A structural bug: the layer's split gives TP rank 0 one row fewer and rank 1 one more. Every consumer
    reads the same cached sizes, so the layer stays self-consistent; the structure check names it."""
    layers = _layers()
    from deepspeed.module_inject.tp_shard import get_shard_size_list

    def _freeze_partition_sizes(self, total_size):
        sizes = list(get_shard_size_list(total_size, self.tp_world_size, self.tp_meta, self.name))
        if len(sizes) > 1 and sizes[0] > 1:
            sizes[0], sizes[1] = sizes[0] - 1, sizes[1] + 1  # planted: one row moved to the next rank
        self._partition_sizes = tuple(sizes)
        return self._partition_sizes

    return _swap(layers.TensorParallel_Layer, "_freeze_partition_sizes", _freeze_partition_sizes)


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


def _add_bias_in_fp32():
    layers = _layers()

    def add_bias(input, bias):
        if bias is None:
            return input
        if layers.is_autotp_training_mode():
            # Training mode - avoid inplace to ensure correct autograd
            input = input + bias.float()  # planted: upstream adds the bias in its own dtype (a no-op in fp32)
            return input
        else:
            input += bias
            return input

    return _swap(layers, "add_bias", add_bias)


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


def _column_forward_extra_allreduce():
    layers = _layers()
    pg_utils, dist = layers.pg_utils, layers.dist

    def forward(ctx, group, input):
        ctx.group = group
        if pg_utils.is_parallel(group):
            # upstream issues no collective here; the input is replicated, so a MAX all-reduce of a
            # copy leaves every number as it was: a stray synchronizing collective per call
            dist.all_reduce(input.detach().clone(), op=dist.ReduceOp.MAX, group=group)
        return input

    return _swap(layers.ColumnParallel, "forward", staticmethod(forward))


# -- RowParallel / ScatterToTensorParallelRegion / LinearAllreduce (row-parallel heads) --------------

def _scatter_backward(reduce=True, offset_zero=False):
    def patch():
        layers = _layers()
        pg_utils, dist = layers.pg_utils, layers.dist

        def backward(ctx, grad_output):
            grad_input = grad_output.new_zeros(ctx.input_shape)
            offset = 0 if offset_zero else ctx.offset  # upstream: ctx.offset
            grad_input.narrow(-1, offset, ctx.size).copy_(grad_output)
            if reduce and pg_utils.is_parallel(ctx.group):  # upstream: always all-reduces
                dist.all_reduce(grad_input, group=ctx.group)
            return None, grad_input, None, None

        return _swap(layers.ScatterToTensorParallelRegion, "backward", staticmethod(backward))

    return patch


def _row_forward(reduce=True, bias_first=False):
    def patch():
        layers = _layers()

        def forward(self, input):
            self._assert_compiled_if_deferred()
            output = torch_matmul_t(input, self.weight)
            if bias_first and self.bias is not None:  # upstream adds the replicated bias after the reduce
                output = layers.add_bias(output, self.bias)
            if reduce and not self.defer_collectives_to_compiler:  # upstream: always RowParallel
                output = layers.RowParallel.apply(self.mp_group, output, not self.is_training_mode())
            if not bias_first and self.bias is not None:
                output = layers.add_bias(output, self.bias)
            return output

        return _swap(layers.LinearAllreduce, "forward", forward)

    return patch


def torch_matmul_t(input, weight):
    import torch

    return torch.matmul(input, weight.transpose(-1, -2))


# -- HiddenParallelEmbedding / VocabParallelEmbedding (tied heads, direct embedding) -----------------

def _hidden_embedding(detached=False, freq=True, scale=True):
    def patch():
        return _hidden_embedding_forward(detached, freq, scale)

    return patch


def _hidden_embedding_forward(detached, freq, scale):
    layers = _layers()
    F = layers.F

    def forward(self, input):
        self._assert_compiled_if_deferred()
        output = F.embedding(input, self.weight.detach() if detached else self.weight,  # upstream: self.weight
                             padding_idx=self.padding_idx,
                             scale_grad_by_freq=self.scale_grad_by_freq and freq)  # upstream: self.scale_grad_by_freq
        if self.is_tp_parallel:
            output = layers.GatherFromTensorParallelRegion.apply(self.mp_group, output, self._partition_sizes)
        if self.embed_scale is not None and scale:  # upstream: without `and scale`
            output = output * self.embed_scale.to(self.weight.dtype)
        return output

    return _swap(layers.HiddenParallelEmbedding, "forward", forward)


def _vocab_embedding(first_excluded=False, reduce=True, scale=True):
    def patch():
        layers = _layers()
        F = layers.F

        def forward(self, input):
            self._assert_compiled_if_deferred()
            if not self.is_tp_parallel:
                output = F.embedding(input, self.weight, padding_idx=self.padding_idx)
            else:
                if first_excluded:  # upstream: input < self.vocab_start_index
                    input_mask = (input <= self.vocab_start_index) | (input >= self.vocab_end_index)
                else:
                    input_mask = (input < self.vocab_start_index) | (input >= self.vocab_end_index)
                local_input = (input - self.vocab_start_index).masked_fill(input_mask, 0)
                output = F.embedding(local_input, self.weight, padding_idx=self.padding_idx)
                output = output.masked_fill(input_mask.unsqueeze(-1), 0.0)
                if reduce:  # upstream: always RowParallel (the all-reduce of the partial lookups)
                    output = layers.RowParallel.apply(self.mp_group, output, not self.is_training_mode())
            if self.embed_scale is not None and scale:  # upstream: without `and scale`
                output = output * self.embed_scale.to(self.weight.dtype)
            return output

        return _swap(layers.VocabParallelEmbedding, "forward", forward)

    return patch


# -- _VocabParallelLinearCrossEntropy (fused linear + CE) --------------------------------------------

def _fused():
    import importlib

    return importlib.import_module("deepspeed.sequence.linear_cross_entropy")


def _fused_forward_mutant(reduce_stats=True, chunk_offset_zero=False, stats_in_input_dtype=False):
    def patch():
        import torch

        lce = _fused()
        dist, pg_utils, _fp32_logits = lce.dist, lce.pg_utils, lce._fp32_logits
        import math

        def forward(ctx, hidden, weight, bias, target, tp_group, vocab_start_index, vocab_end_index, ignore_index,
                    chunk_rows, compute_dtype):
            num_tokens = hidden.shape[0]
            local_vocab_size = weight.shape[0]
            tp_active = pg_utils.is_parallel(tp_group)
            hidden_compute = hidden.to(compute_dtype)
            weight_compute = weight.to(compute_dtype)
            bias_compute = None if bias is None else bias.to(compute_dtype)
            valid = target != ignore_index
            in_shard = valid & (target >= vocab_start_index) & (target < vocab_end_index)
            local_target = (target - vocab_start_index).clamp(0, local_vocab_size - 1)
            # upstream: dtype=torch.float32; the planted bug keeps the per-token loss (and, through
            # empty_like, the row max and exp-sum saved for backward) in the input dtype
            loss = torch.empty(num_tokens, dtype=hidden.dtype if stats_in_input_dtype else torch.float32,
                               device=hidden.device)
            row_max = torch.empty_like(loss)
            row_sum_exp = torch.empty_like(loss)
            for start in range(0, num_tokens, chunk_rows):
                end = min(start + chunk_rows, num_tokens)
                # upstream: the chunk's own targets [start:end]; this one reads them from row 0 on
                t0, t1 = (0, end - start) if chunk_offset_zero else (start, end)
                logits = _fp32_logits(hidden_compute[start:end], weight_compute, bias_compute)
                chunk_max = logits.amax(dim=-1)
                if tp_active:
                    dist.all_reduce(chunk_max, op=dist.ReduceOp.MAX, group=tp_group)
                logits.sub_(chunk_max.unsqueeze(-1))
                target_logit = logits.gather(-1, local_target[t0:t1].unsqueeze(-1)).squeeze(-1)
                target_logit = torch.where(in_shard[t0:t1], target_logit, torch.zeros_like(target_logit))
                stats = torch.stack([logits.exp_().sum(dim=-1), target_logit], dim=-1)
                if tp_active and reduce_stats:  # upstream: always sums (exp-sum, target logit) over TP
                    dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=tp_group)
                sum_exp, target_logit = stats.unbind(-1)
                row_max[start:end] = chunk_max
                row_sum_exp[start:end] = sum_exp
                loss[start:end] = torch.where(valid[start:end], sum_exp.log() - target_logit,
                                              torch.zeros_like(sum_exp))
            ctx.save_for_backward(hidden, weight, bias, valid, in_shard, local_target, row_max, row_sum_exp)
            ctx.tp_group = tp_group
            ctx.compute_dtype = compute_dtype
            num_chunks = math.ceil(num_tokens / chunk_rows) if num_tokens else 1
            ctx.block_cols = max(1, math.ceil(local_vocab_size / num_chunks))
            return loss

        return _swap(lce._VocabParallelLinearCrossEntropy, "forward", staticmethod(forward))

    return patch


def _fused_backward_hidden_not_reduced():
    lce = _fused()
    cls = lce._VocabParallelLinearCrossEntropy
    original = cls.__dict__["backward"]
    pg_utils = lce.pg_utils

    def backward(ctx, grad_loss):
        # upstream all-reduces the partial hidden gradient over tp_group; make that group look
        # unparallel to this call only, so every other line runs as upstream
        real = pg_utils.is_parallel
        pg_utils.is_parallel = lambda group: False if group is ctx.tp_group else real(group)
        try:
            return original.__func__(ctx, grad_loss)
        finally:
            pg_utils.is_parallel = real

    return _swap(cls, "backward", staticmethod(backward))


# -- LigerVocabParallelCEFunction (Liger-Kernel 0.8.5) -----------------------------------------------

def _liger_function():
    from liger_kernel.ops.vocab_parallel_cross_entropy import LigerVocabParallelCEFunction

    return LigerVocabParallelCEFunction


def _liger_backward_vocab_start_zero():
    cls = _liger_function()
    original = cls.__dict__["forward"].__func__

    def forward(ctx, *args):
        loss = original(ctx, *args)
        ctx.vocab_start = 0  # upstream: rank * v_local; every rank's backward takes rank 0's shard start
        return loss

    return _swap(cls, "forward", staticmethod(forward))


def _liger_local_group():
    cls = _liger_function()
    original = cls.__dict__["forward"].__func__

    def forward(ctx, logits, target, tp_group, *rest):
        # upstream passes tp_group: without it every all-reduce is skipped and vocab_start is 0
        return original(ctx, logits, target, None, *rest)

    return _swap(cls, "forward", staticmethod(forward))


# -- _VocabParallelCrossEntropy ---------------------------------------------------------------------

def _ce_forward(ctx, vocab_parallel_logits, target, tp_group, vocab_start_index, vocab_end_index, ignore_index, *,
                max_mode="allreduce", reduce_sum=True, reduce_target=True, start_shift=0, upcast=True,
                sum_exp_in_logits_dtype=False):
    """Upstream _VocabParallelCrossEntropy.forward with switches for the planted changes."""
    import torch

    ce = _ce()
    dist, pg_utils = ce.dist, ce.pg_utils
    vocab_start_index = vocab_start_index + start_shift
    target = target.to(dtype=torch.long)
    # upstream: .float(); upcast=False keeps bf16/fp16 logits (a no-op in fp32: precision-only)
    logits = vocab_parallel_logits.float() if upcast else vocab_parallel_logits
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
    if sum_exp_in_logits_dtype:  # planted: the partial sums cross the wire in the logits dtype (upstream: fp32)
        global_sum_exp = global_sum_exp.to(vocab_parallel_logits.dtype)
    if reduce_sum and pg_utils.is_parallel(tp_group):
        dist.all_reduce(global_sum_exp, op=dist.ReduceOp.SUM, group=tp_group)
    global_sum_exp = global_sum_exp.float() if sum_exp_in_logits_dtype else global_sum_exp

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


def _ops():
    import importlib

    return importlib.import_module("deepspeed.sequence.vocab_parallel_ops")


def _ops_stats_local_max():
    ops = _ops()
    original = ops._softmax_stats

    def _softmax_stats(logits_2d_list, tp_group):
        # upstream all-reduces the row maxima (ReduceOp.MAX) before the exp-sums: here each rank keeps
        # its own, and the summed exp(z - max) mixes shifts
        real = ops.dist.all_reduce

        def all_reduce(tensor, op=None, group=None, **kwargs):
            if op == ops.dist.ReduceOp.MAX:
                return None
            return real(tensor, op=op, group=group, **kwargs)
        ops.dist.all_reduce = all_reduce
        try:
            return original(logits_2d_list, tp_group)
        finally:
            ops.dist.all_reduce = real

    return _swap(ops, "_softmax_stats", _softmax_stats)


def _ops_logprobs_backward_no_target_term():
    ops = _ops()

    def backward(ctx, grad_output):
        vocab_parallel_logits, global_max, log_sum_exp, local_index, index_in_partition, valid_index = ctx.saved_tensors
        logits = ops._flatten(vocab_parallel_logits)
        grad_output = grad_output.reshape(valid_index.shape).float() * valid_index
        grad_sum = grad_output.sum(dim=-1, keepdim=True)
        zero_grad_row = ~valid_index.any(dim=-1, keepdim=True) | ops._undefined_rows(global_max)
        grad_logits = ops.torch.empty_like(logits)
        for rows in ops._row_chunks(logits):
            grad_chunk = ops.torch.exp(ops._log_softmax(logits[rows], global_max[rows], log_sum_exp[rows])) * -grad_sum[rows]
            grad_chunk.masked_fill_(zero_grad_row[rows], 0.0)
            # upstream adds the requested ids' own gradient here (scatter_add_ of index_grad)
            grad_logits[rows] = grad_chunk
        return grad_logits.view_as(vocab_parallel_logits), None, None, None, None

    return _swap(ops._VocabParallelLogProbs, "backward", staticmethod(backward))


def _ops_kl_ignores_reverse():
    ops = _ops()

    def vocab_parallel_kl_div(student_logits, teacher_logits, reverse=False, tp_group=None):
        if student_logits.shape != teacher_logits.shape:
            raise ValueError("student_logits and teacher_logits must have the same shape and vocabulary sharding")
        # upstream hands bool(reverse) to the Function: here the forward KL(teacher || student) always
        kl = ops._VocabParallelKLDiv.apply(student_logits, teacher_logits, False, tp_group)
        return kl.view(student_logits.shape[:-1])

    return _swap(ops, "vocab_parallel_kl_div", vocab_parallel_kl_div)


def _ops_kl_backward_uncentred():
    """_VocabParallelKLDiv.backward, upstream line for line, except that the weighted side's log-ratio is not
    centred by the KL (d KL / d z_A = p_A (log p_A - log p_B - KL) loses its - KL)."""
    ops = _ops()
    torch = ops.torch

    def backward(ctx, grad_output):
        student_logits, teacher_logits, global_max, log_sum_exp, kl = ctx.saved_tensors
        student = ops._flatten(student_logits)
        teacher = ops._flatten(teacher_logits)
        grad_output = grad_output.reshape(-1, 1).float()
        need_student_grad, need_teacher_grad = ctx.needs_input_grad[:2]
        grad_student = torch.empty_like(student) if need_student_grad else None
        grad_teacher = torch.empty_like(teacher) if need_teacher_grad else None
        a_grad, b_grad = ops._order_kl_arguments(grad_student, grad_teacher, ctx.reverse)
        undefined_row = ops._undefined_rows(global_max).any(dim=0)
        for rows in ops._row_chunks(student):
            student_log_probs = ops._log_softmax(student[rows], global_max[0, rows], log_sum_exp[0, rows])
            teacher_log_probs = ops._log_softmax(teacher[rows], global_max[1, rows], log_sum_exp[1, rows])
            a_log_probs, b_log_probs = ops._order_kl_arguments(student_log_probs, teacher_log_probs, ctx.reverse)
            a_probs = torch.exp(a_log_probs)
            if a_grad is not None:
                log_ratio = a_log_probs - b_log_probs  # upstream subtracts kl[rows].unsqueeze(-1) here
                a_grad_chunk = ops._weighted_by_probs(a_log_probs, log_ratio, a_probs).mul_(grad_output[rows])
                a_grad[rows] = a_grad_chunk.masked_fill_(undefined_row[rows], 0.0)
            if b_grad is not None:
                b_grad_chunk = (torch.exp(b_log_probs) - a_probs).mul_(grad_output[rows])
                b_grad[rows] = b_grad_chunk.masked_fill_(undefined_row[rows], 0.0)
        if grad_student is not None:
            grad_student = grad_student.view_as(student_logits)
        if grad_teacher is not None:
            grad_teacher = grad_teacher.view_as(teacher_logits)
        return grad_student, grad_teacher, None, None

    return _swap(ops._VocabParallelKLDiv, "backward", staticmethod(ops.once_differentiable(backward)))


def _sp_sum_local():
    """_global_sp_sum returns the rank's own value: a sum over the sequence chunk, a chunk's sum over the
    sequence's count for a mean. linear_cross_entropy imported the name, so both modules' are replaced."""
    import importlib

    ce, fused = _ce(), importlib.import_module("deepspeed.sequence.linear_cross_entropy")

    def _global_sp_sum(local_value, sp_group):
        return local_value

    undo = [_swap(module, "_global_sp_sum", _global_sp_sum) for module in (ce, fused)]
    return lambda: [u() for u in undo]


def _seq_ce_sums_gradients():
    ce = _ce()

    def vocab_sequence_parallel_cross_entropy(vocab_parallel_logits, target, sp_group, tp_group=None,
                                              vocab_start_index=None, vocab_end_index=None, ignore_index=-100,
                                              reduction="none", gather_sequence_loss=True, backend="torch"):
        if backend not in ("torch", "liger"):
            raise ValueError(f"Unsupported vocabulary-parallel CE backend: {backend}")
        if gather_sequence_loss and reduction != "none":
            raise ValueError("gather_sequence_loss is only supported with reduction='none'")
        if gather_sequence_loss and sp_group is None:
            raise ValueError("sp_group is required when gather_sequence_loss=True")
        loss = ce.vocab_parallel_cross_entropy(vocab_parallel_logits, target, tp_group=tp_group, sp_group=sp_group,
                                               vocab_start_index=vocab_start_index, vocab_end_index=vocab_end_index,
                                               ignore_index=ignore_index, reduction=reduction, backend=backend)
        if not gather_sequence_loss:
            return loss
        # upstream passes sum_gradients=False (the legacy local slice): here the reduce-scatter
        return ce._GatherSequenceLoss.apply(loss, sp_group, True)

    return _swap(ce, "vocab_sequence_parallel_cross_entropy", vocab_sequence_parallel_cross_entropy)


def _ce_module_drops_ignore_index():
    ce = _ce()

    def forward(self, vocab_parallel_logits, target):
        # upstream passes ignore_index=self.ignore_index: here the function's default (-100)
        return ce.vocab_parallel_cross_entropy(vocab_parallel_logits, target, tp_group=self.tp_group,
                                               sp_group=self.sp_group, vocab_start_index=self.vocab_start_index,
                                               vocab_end_index=self.vocab_end_index, reduction=self.reduction,
                                               gather_sequence_loss=self.gather_sequence_loss, backend=self.backend)

    return _swap(ce.VocabParallelCrossEntropyLoss, "forward", forward)


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


def _ce_reduced_in_logits_dtype():
    """vocab_parallel_cross_entropy's sum/mean, as upstream writes them, over the per-token losses
    rounded to the logits dtype first (upstream reduces the fp32 losses the CE returns)."""
    ce = _ce()
    original = ce.vocab_parallel_cross_entropy

    def vocab_parallel_cross_entropy(vocab_parallel_logits, target, tp_group=None, sp_group=None,
                                     vocab_start_index=None, vocab_end_index=None, global_vocab_size=None,
                                     ignore_index=-100, reduction="mean", gather_sequence_loss=False, backend="torch"):
        loss = original(vocab_parallel_logits, target, tp_group=tp_group, sp_group=sp_group,
                        vocab_start_index=vocab_start_index, vocab_end_index=vocab_end_index,
                        global_vocab_size=global_vocab_size, ignore_index=ignore_index, reduction="none",
                        gather_sequence_loss=gather_sequence_loss if reduction == "none" else False, backend=backend)
        if reduction == "none":
            return loss
        loss = loss.to(vocab_parallel_logits.dtype)  # planted: a no-op in fp32
        loss_sum = ce._global_sp_sum(loss.sum(), sp_group)
        if reduction == "sum":
            return loss_sum

        valid_tokens = (target != ignore_index).sum().to(dtype=loss.dtype)
        if ce.pg_utils.is_parallel(sp_group):
            ce.dist.all_reduce(valid_tokens, op=ce.dist.ReduceOp.SUM, group=sp_group)
        return loss_sum / valid_tokens.clamp_min(1)

    return _swap(ce, "vocab_parallel_cross_entropy", vocab_parallel_cross_entropy)


def _unfused_master_in_model_dtype():
    """FP16_UnfusedOptimizer.step (ZeRO 0 with bf16/fp16), upstream line for line, except that the
    fp32 master is rounded to the model dtype after every update: master weights not kept in fp32."""
    import importlib

    import torch

    mod = importlib.import_module("deepspeed.runtime.fp16.unfused_optimizer")

    def step(self, closure=None):
        if self.fused_lamb_legacy:
            return self.step_fused_lamb()

        self.overflow = self.overflow_checker.check()
        if self.overflow:
            return self._skip_invalid_grad_norm()

        norm_groups = []
        for i, group in enumerate(self.fp16_groups):
            grads_for_norm, _ = mod.split_params_grads_into_shared_and_expert_params(group)
            norm_group_value = 0.0
            if len(grads_for_norm) > 0:
                norm_group_value = mod.get_weight_norm(grads_for_norm, mpu=self.mpu)
            norm_groups.append(norm_group_value)

            # copying gradients to fp32 to work with fp32 parameters
            for fp32_param, fp16_param in zip(self.fp32_groups[i], self.fp16_groups[i]):
                if fp16_param.grad is None:
                    fp32_param.grad = torch.zeros(fp16_param.size(), dtype=fp32_param.dtype, device=fp32_param.device)
                else:
                    fp32_param.grad = fp16_param.grad.to(fp32_param.dtype)

        self._global_grad_norm = mod.get_global_norm(norm_list=norm_groups)
        if mod.is_invalid_grad_norm(self._global_grad_norm):
            return self._skip_invalid_grad_norm()
        self._update_scale(False)
        self.unscale_and_clip_grads(self._global_grad_norm)

        self.optimizer.step()

        for fp32_group, fp16_group in zip(self.fp32_groups, self.fp16_groups):
            for idx, (fp32_param, fp16_param) in enumerate(zip(fp32_group, fp16_group)):

                #remove the fp32 grad
                fp32_param.grad = None

                #copy data from fp32 to fp16
                fp16_param.data.copy_(fp32_param.data)
                fp32_param.data.copy_(fp16_param.data)  # planted: the master keeps only model-dtype precision

        return self.overflow

    return _swap(mod.FP16_UnfusedOptimizer, "step", step)


def _loss_scaler_ignores_hysteresis():
    """DynamicLossScaler.update_scale (ZeRO 1-3 with fp16), upstream line for line, except that an overflow halves
    the scale whatever the hysteresis (delayed_shift) left: the hysteresis key parsed and never applied."""
    import importlib

    mod = importlib.import_module("deepspeed.runtime.fp16.loss_scaler")

    def update_scale(self, overflow):
        if overflow:
            if True:  # planted: was `self.delayed_shift == 1 or self.cur_hysteresis == 1`
                if (self.cur_scale == self.min_scale) and self.raise_error_at_min_scale:
                    raise Exception(
                        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.")
                else:
                    self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift

            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    return _swap(mod.DynamicLossScaler, "update_scale", update_scale)


def _fused_backward_hidden_grad_in_input_dtype():
    """_VocabParallelLinearCrossEntropy.backward, upstream line for line, except that the hidden
    gradient is accumulated over vocabulary blocks (and all-reduced) in the input dtype, not fp32."""
    import torch

    lce = _fused()
    cls = lce._VocabParallelLinearCrossEntropy
    pg_utils, dist = lce.pg_utils, lce.dist

    @lce.once_differentiable
    def backward(ctx, grad_loss):
        hidden, weight, bias, valid, in_shard, local_target, row_max, row_sum_exp = ctx.saved_tensors
        compute_dtype = ctx.compute_dtype
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        local_vocab_size = weight.shape[0]

        hidden_compute = hidden.to(compute_dtype)
        token_grad = torch.where(valid, grad_loss.float(), torch.zeros_like(row_max))
        prob_scale = (token_grad / row_sum_exp).unsqueeze(-1)
        neg_row_max = -row_max.unsqueeze(-1)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        # planted: upstream accumulates in torch.zeros_like(hidden, dtype=torch.float32); a no-op in fp32
        grad_hidden = torch.zeros_like(hidden) if needs_hidden else None
        grad_weight = torch.empty_like(weight) if needs_weight else None
        grad_bias = torch.empty_like(bias) if needs_bias else None

        for start in range(0, local_vocab_size, ctx.block_cols):
            end = min(start + ctx.block_cols, local_vocab_size)
            weight_block = weight[start:end].to(compute_dtype)
            bias_block = None if bias is None else bias[start:end].to(compute_dtype)
            logits = lce._fp32_logits(hidden_compute, weight_block, bias_block, neg_row_max)

            grad_logits = logits.exp_().mul_(prob_scale)
            in_block = in_shard & (local_target >= start) & (local_target < end)
            block_rows = rows[in_block]
            grad_logits[block_rows, local_target[in_block] - start] -= token_grad[in_block]

            if grad_bias is not None:
                grad_bias[start:end] = grad_logits.sum(dim=0)
            grad_logits = grad_logits.to(compute_dtype)
            if grad_weight is not None:
                grad_weight[start:end] = grad_logits.t() @ hidden_compute
            if grad_hidden is not None:
                lce._accumulate_matmul(grad_hidden, grad_logits, weight_block)

        if grad_hidden is not None:
            if pg_utils.is_parallel(ctx.tp_group):
                dist.all_reduce(grad_hidden, op=dist.ReduceOp.SUM, group=ctx.tp_group)
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None, None

    return _swap(cls, "backward", staticmethod(backward))


def _causal_loss_ignores_num_items():
    cls = _ce().VocabParallelCausalLMLoss
    original = cls.__call__

    def __call__(self, logits, labels=None, vocab_size=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        # upstream: sum / num_items_in_batch when given one; this one always takes the local mean
        return original(self, logits, labels=labels, vocab_size=vocab_size, shift_labels=shift_labels,
                        num_items_in_batch=None, **kwargs)

    return _swap(cls, "__call__", __call__)


def _causal_loss_drops_shift_labels():
    cls = _ce().VocabParallelCausalLMLoss
    original = cls.__call__

    def __call__(self, logits, labels=None, vocab_size=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        # upstream: shift_labels scored as given against every position; this one shifts labels itself
        return original(self, logits, labels=labels, vocab_size=vocab_size, num_items_in_batch=num_items_in_batch,
                        **kwargs)

    return _swap(cls, "__call__", __call__)


# -- the suite's own references (parent process) ------------------------------------------------------

def _reference_no_causal_shift():
    import references.tiny_lm as tiny_lm
    from references import loss as ref_loss

    def causal_lm_loss(logits, labels, reduction="mean", ignore_index=-100, num_items_in_batch=None,
                       label_smoothing=0.0):
        # upstream (references/loss.py): logits[..., :-1, :] predict labels[..., 1:]
        losses = ref_loss.token_losses(logits, labels, ignore_index, label_smoothing)
        if reduction == "none":
            return losses[..., 1:]  # keep the [B, T-1] shape, so only the values can give it away
        total = losses.sum()
        if reduction == "sum":
            return total
        if reduction == "num_items":
            return total / int(num_items_in_batch)
        return total / (labels != ignore_index).sum()

    return _swap(tiny_lm, "causal_lm_loss", causal_lm_loss)


def _reference_grad_not_divided_by_gas():
    import references.trajectory as trajectory

    original = trajectory._scalar

    def scalar(loss, reduction):
        value = original(loss, reduction)
        return _NoDivide(value)

    return _swap(trajectory, "_scalar", scalar)


class _NoDivide:
    """Wraps the loss so that '/ micro_batches' in trajectory.trainer_objective is a no-op."""

    def __init__(self, value):
        self.value = value

    def __truediv__(self, _):  # upstream: scalar / train.micro_batches (mean, sum, none)
        return self.value

    def __mul__(self, other):  # num_items: scalar * dp, which the mutant leaves alone
        return self.value * other


def _inference_head_offset_zero():
    import torch
    from deepspeed.module_inject import layers

    def forward(self, input):
        input_shard_sizes = self._partition_sizes
        assert sum(input_shard_sizes) == input.shape[-1]
        input_shard_size = input_shard_sizes[self.tp_index]
        input_shard_offset = 0  # planted: upstream is sum(input_shard_sizes[0:self.tp_index])
        output = torch.matmul(input[:, :, input_shard_offset:input_shard_offset + input_shard_size],
                              self.weight.transpose(-1, -2))
        if layers.pg_utils.is_parallel(self.mp_group):
            layers.dist.inference_all_reduce(output, group=self.mp_group)
        if self.bias is not None:
            output = layers.add_bias(output, self.bias)
        return output

    return _swap(layers.LmHeadLinearAllreduce, "forward", forward)


def _fused_ce_ignores_autocast():
    from deepspeed.sequence import linear_cross_entropy

    def _autocast_dtype(device_type):
        return None  # planted: upstream returns torch.get_autocast_dtype(device_type) while autocast is on

    return _swap(linear_cross_entropy, "_autocast_dtype", _autocast_dtype)


def _autotp_accepts_empty_vocab_shard():
    from deepspeed.module_inject import auto_tp

    def _validate_vocab_parallel_layer(self, child, name):
        tied_embeddings = self._find_tied_embedding_modules(child)
        for _, _, embedding, _ in tied_embeddings:
            auto_tp.VocabParallelEmbedding.validate_embedding(embedding)
        # planted: upstream raises ValueError("vocab_parallel_lm_head requires nonempty vocabulary
        # shards ...") here when a shard would be empty
        return tied_embeddings

    return _swap(auto_tp.AutoTP, "_validate_vocab_parallel_layer", _validate_vocab_parallel_layer)


def _tie_fallback_unties():
    from torch import nn

    from deepspeed.module_inject import auto_tp

    original = auto_tp.AutoTP._configure_gathered_column_tie_fallbacks

    def _configure_gathered_column_tie_fallbacks(self):
        configured = self._gathered_column_tie_fallbacks_configured
        original(self)
        if configured:
            return
        # planted: upstream leaves the recorded head holding the embedding's Parameter; here it gets a copy, so
        # both stay replicated but each trains on its own gradient (the tie broken)
        for name, module in list(self.module.named_modules()):
            if name in self._tied_gathered_column_module_names and not isinstance(module, nn.Embedding):
                module.weight = nn.Parameter(module.weight.detach().clone())

    return _swap(auto_tp.AutoTP, "_configure_gathered_column_tie_fallbacks", _configure_gathered_column_tie_fallbacks)


# -- PyTorch DTensor (torch.distributed.tensor, torch 2.13) -------------------------------------------

def _partial_no_allreduce():
    from torch.distributed.tensor.placement_types import Partial

    def _reduce_value(self, tensor, mesh, mesh_dim):
        return tensor  # upstream: funcol.all_reduce(tensor, reduceOp=self.reduce_op, group=(mesh, mesh_dim))

    return _swap(Partial, "_reduce_value", _reduce_value)


def _loss_parallel_local_sumexp():
    import torch
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d
    import torch._prims_common as utils
    from torch.distributed.tensor.parallel import loss

    def _log_softmax(x, dim, half_to_float, mesh, mesh_dim):
        if half_to_float:
            if x.dtype != torch.half:
                raise AssertionError
        computation_dtype, result_dtype = utils.elementwise_dtypes(
            x, type_promotion_kind=utils.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        x = x.to(dtype=computation_dtype, memory_format=torch.contiguous_format)
        if x.numel() == 0:
            shifted = x
        else:
            x_max = torch.amax(x, dim, keepdim=True)
            x_max = funcol.all_reduce(x_max, reduceOp=c10d.ReduceOp.MAX.name, group=(mesh, mesh_dim))
            shifted = x - x_max
        # upstream all-reduces (SUM) the shard's exp-sum here: the denominator stays local
        shifted_sumexp = torch.sum(torch.exp(shifted), dim, keepdim=True)
        result = shifted - torch.log(shifted_sumexp)
        if not half_to_float:
            result = result.to(result_dtype)
        return result

    return _swap(loss, "_log_softmax", _log_softmax)


def _mask_partial_unmasked():
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor.placement_types import _MaskPartial

    def _reduce_value(self, tensor, mesh, mesh_dim):
        if self.mask_buffer.data is None:
            raise AssertionError
        # upstream applies the mask first: lookups of other shards' tokens (remapped to local row 0) are zeroed
        self.mask_buffer.release_mask()
        return funcol.all_reduce(tensor, reduceOp=self.reduce_op, group=(mesh, mesh_dim))

    return _swap(_MaskPartial, "_reduce_value", _reduce_value)


# -- Megatron-core 0.16.1 (megatron.core.tensor_parallel) -------------------------------------------

def _megatron_split_rank0_slice():
    import importlib

    mappings = importlib.import_module("megatron.core.tensor_parallel.mappings")
    split_tensor_along_last_dim = mappings.split_tensor_along_last_dim

    def _split_along_last_dim(input_, group):
        assert group is not None, "group should not be None"
        world_size = group.size()
        if world_size == 1:
            return input_
        input_list = split_tensor_along_last_dim(input_, world_size)
        rank = group.rank()  # noqa: F841 - upstream keeps input_list[rank]
        output = input_list[0].contiguous()  # planted: every rank keeps rank 0's slice
        return output

    return _swap(mappings, "_split_along_last_dim", _split_along_last_dim)


def _megatron_ce_local_sumexp():
    import torch
    from megatron.core.parallel_state import (get_tensor_model_parallel_group, get_tensor_model_parallel_rank,
                                              get_tensor_model_parallel_world_size)
    from megatron.core.tensor_parallel import cross_entropy
    from megatron.core.tensor_parallel.utils import VocabUtility

    VocabParallelCrossEntropy = cross_entropy.VocabParallelCrossEntropy

    def forward(ctx, vocab_parallel_logits, target, label_smoothing=0.0):
        vocab_parallel_logits, logits_max = VocabParallelCrossEntropy.calculate_logits_max(vocab_parallel_logits)
        torch.distributed.all_reduce(logits_max, op=torch.distributed.ReduceOp.MAX,
                                     group=get_tensor_model_parallel_group())
        get_vocab_range = VocabUtility.vocab_range_from_per_partition_vocab_size
        partition_vocab_size = vocab_parallel_logits.size()[-1]
        rank = get_tensor_model_parallel_rank()
        world_size = get_tensor_model_parallel_world_size()
        vocab_start_index, vocab_end_index = get_vocab_range(partition_vocab_size, rank, world_size)
        (target_mask, masked_target_1d, predicted_logits, sum_exp_logits, exp_logits) = (
            VocabParallelCrossEntropy.calculate_predicted_logits(
                vocab_parallel_logits, target, logits_max, vocab_start_index, vocab_end_index))
        torch.distributed.all_reduce(predicted_logits, op=torch.distributed.ReduceOp.SUM,
                                     group=get_tensor_model_parallel_group())
        # planted: upstream all-reduces (SUM) sum_exp_logits here; the denominator stays local
        exp_logits, loss = VocabParallelCrossEntropy.calculate_cross_entropy_loss(
            exp_logits, predicted_logits, sum_exp_logits)
        vocab_size = exp_logits.size(-1)
        if label_smoothing > 0:
            assert 1.0 > label_smoothing > 0.0
            smoothing = label_smoothing * vocab_size / (vocab_size - 1)
            log_probs = torch.log(exp_logits)
            mean_log_probs = log_probs.mean(dim=-1)
            loss = (1.0 - smoothing) * loss - smoothing * mean_log_probs
        ctx.label_smoothing, ctx.vocab_size = label_smoothing, vocab_size
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    return _swap(cross_entropy._VocabParallelCrossEntropy, "forward", staticmethod(forward))


def _megatron_embedding_unmasked():
    import torch.nn.functional as F
    from megatron.core.tensor_parallel import layers

    def forward(self, input_):
        if self.tp_group.size() > 1:
            input_mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
            masked_input = input_.clone() - self.vocab_start_index
            masked_input[input_mask] = 0
        else:
            masked_input = input_
        if self.deterministic_mode:
            output_parallel = self.weight[masked_input]
        else:
            output_parallel = F.embedding(masked_input, self.weight)
        # planted: upstream zeroes output_parallel[input_mask, :] here (other shards' tokens read local row 0)
        if self.reduce_scatter_embeddings:
            output_parallel = output_parallel.transpose(0, 1).contiguous()
            output = layers.reduce_scatter_to_sequence_parallel_region(output_parallel, group=self.tp_group)
        else:
            output = layers.reduce_from_tensor_model_parallel_region(output_parallel, group=self.tp_group)
        return output

    return _swap(layers.VocabParallelEmbedding, "forward", forward)


# -- universal checkpoint restore (deepspeed/checkpoint/universal_checkpoint.py) ------------------------------------

def _universal():
    import importlib

    return importlib.import_module("deepspeed.checkpoint.universal_checkpoint")


def _uc_restore_rank0_slice():
    uc = _universal()
    original = uc.load_hp_checkpoint_state

    def load_hp_checkpoint_state(self, folder, tp_rank, tp_world_size, ep_rank=0, ep_size=1):
        # planted: upstream slices the universal tensor for the rank's own tp_rank
        return original(self, folder, 0, tp_world_size, ep_rank=ep_rank, ep_size=ep_size)

    # enable_universal_checkpoint binds the module's function to each parameter when the optimizer is built
    return _swap(uc, "load_hp_checkpoint_state", load_hp_checkpoint_state)


def _uc_moments_zeroed():
    uc = _universal()
    original = uc.load_hp_checkpoint_state

    def load_hp_checkpoint_state(self, folder, tp_rank, tp_world_size, ep_rank=0, ep_size=1):
        step = original(self, folder, tp_rank, tp_world_size, ep_rank=ep_rank, ep_size=ep_size)
        fragments = self._hp_mapping.optim_fragment
        for key in fragments:  # planted: upstream keeps the moments it read; a fresh optimizer's are zeros
            fragments[key] = fragments[key].new_zeros(fragments[key].shape)
        return step

    return _swap(uc, "load_hp_checkpoint_state", load_hp_checkpoint_state)


MUTANTS = [
    Mutant("partition_row_moved",
           "TensorParallel_Layer._freeze_partition_sizes moves one row of the split from TP rank 0 to rank 1: the "
           "head is sharded self-consistently, but not as the partition formula says",
           "deepspeed.module_inject.layers.TensorParallel_Layer._freeze_partition_sizes",
           "structure[<head>.weight] (the built shard's shape against the formula's slice)",
           (COLUMN, VOCAB, INFERENCE, UC_COLUMN), _partition_row_moved),
    Mutant("column_backward_no_allreduce",
           "ColumnParallel.backward returns the local input gradient without its all-reduce: the gradient "
           "reaching the head input misses the other shards' terms",
           "deepspeed.module_inject.layers.ColumnParallel.backward", "head_input_grad", (COLUMN, VOCAB, TIED_VOCAB, D_COLUMN, D_VOCAB, HF_COLUMN,
                                                                             EMBED_SPEC, SPEC_REACH, PRESET, HEURISTIC,
                                                                             ZOO_PLAN, ZOO_VOCAB, ZOO_HEURISTIC,
                                                                             ZOO_PRESET),
           _column_backward_no_allreduce),
    Mutant("column_backward_world_group",
           "ColumnParallel.backward all-reduces over the default (world) group instead of ctx.group",
           "deepspeed.module_inject.layers.ColumnParallel.backward",
           "head_input_grad at TP=2 x DP=2 (world 4: the other replica's gradient is added in); at dp=1 the "
           "world group IS the TP group and only this case can tell", (COLUMN,),
           _column_backward_world_group),
    Mutant("gather_backward_rank0_slice",
           "GatherFromTensorParallelRegion.backward narrows the gathered gradient at offset 0 on every rank: "
           "rank 1 trains its shard with rank 0's logit gradient",
           "deepspeed.module_inject.layers.GatherFromTensorParallelRegion.backward",
           "head_input_grad (all-reduced, so on every rank); grad[head.weight] on rank 1",
           (COLUMN,), _gather_backward_rank0_slice),
    Mutant("gather_forward_reversed",
           "GatherFromTensorParallelRegion.forward concatenates the shards in reverse rank order",
           "deepspeed.module_inject.layers.GatherFromTensorParallelRegion.forward", "logits",
           (COLUMN, D_COLUMN, HF_COLUMN, HEURISTIC), _gather_forward_reversed),
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
           (VOCAB, DS_CE), _ce_forward_mutant(max_mode="local")),
    Mutant("ce_rank0_max",
           "_VocabParallelCrossEntropy shifts by TP rank 0's local max (a broadcast) instead of the global max "
           "(a MAX all-reduce); softmax is shift-invariant, so every number agrees (only the overflow guard "
           "is lost, which |logit| < 2 never needs): numerically equivalent, caught by the collective counts",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward",
           "collectives (a broadcast instead of an all_reduce; numbers agree)", (VOCAB,),
           _ce_forward_mutant(max_mode="rank0")),
    Mutant("ce_local_sum_exp",
           "_VocabParallelCrossEntropy uses the local sum of exp as the softmax denominator (SUM all-reduce dropped)",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss",
           (VOCAB, DS_CE, TIED_VOCAB, D_VOCAB, HF_TIED, PRESET, HEURISTIC), _ce_forward_mutant(reduce_sum=False)),
    Mutant("ce_target_logit_not_reduced",
           "_VocabParallelCrossEntropy drops the all-reduce of the predicted (target) logit: ranks that do not own "
           "the target use 0",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss",
           (VOCAB, DS_CE), _ce_forward_mutant(reduce_target=False)),
    Mutant("ce_vocab_start_off_by_one",
           "_VocabParallelCrossEntropy uses vocab_start_index + 1: the first target of each shard belongs to no "
           "rank and the others are looked up one column to the left",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss",
           (VOCAB, DS_CE), _ce_forward_mutant(start_shift=1)),
    Mutant("ce_backward_no_target_term",
           "_VocabParallelCrossEntropy.backward returns softmax without subtracting the one-hot target",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.backward", "head_input_grad",
           (VOCAB, DS_CE, DS_LIGER_NO_GROUP), _ce_backward_no_target_term),
    Mutant("ce_mean_counts_ignored",
           "vocab_parallel_cross_entropy's mean divides by every token, ignored ones included",
           "deepspeed.sequence.cross_entropy.vocab_parallel_cross_entropy", "loss (mean, scattered ignores)",
           (VOCAB, DS_CE), _ce_mean_counts_ignored),
    Mutant("causal_loss_ignores_num_items",
           "VocabParallelCausalLMLoss drops num_items_in_batch and returns the micro-batch mean",
           "deepspeed.sequence.cross_entropy.VocabParallelCausalLMLoss.__call__", "loss (num_items)",
           (VOCAB,), _causal_loss_ignores_num_items),
    Mutant("causal_loss_drops_shift_labels",
           "VocabParallelCausalLMLoss ignores shift_labels and shifts labels itself (the last position's target lost)",
           "deepspeed.sequence.cross_entropy.VocabParallelCausalLMLoss.__call__", "loss (shift_labels)",
           (VOCAB,), _causal_loss_drops_shift_labels,
           cases=("vocab_parallel-torch-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-shiftlbl",)),
    Mutant("column_forward_extra_allreduce",
           "ColumnParallel.forward issues a MAX all-reduce of (a copy of) its replicated input: every number "
           "is unchanged, one extra TP collective per head call",
           "deepspeed.module_inject.layers.ColumnParallel.forward", "collectives (numbers agree)",
           (COLUMN, VOCAB), _column_forward_extra_allreduce),
    Mutant("scatter_backward_no_allreduce",
           "ScatterToTensorParallelRegion.backward returns this rank's zero-padded input-gradient slice without "
           "the all-reduce: the gradient reaching the row-parallel head's input misses the other hidden slices",
           "deepspeed.module_inject.layers.ScatterToTensorParallelRegion.backward", "head_input_grad",
           (ROW, TIED_ROW, D_ROW, HF_ROW), _scatter_backward(reduce=False)),
    Mutant("scatter_backward_offset_zero",
           "ScatterToTensorParallelRegion.backward writes every rank's gradient slice at hidden offset 0",
           "deepspeed.module_inject.layers.ScatterToTensorParallelRegion.backward", "head_input_grad",
           (ROW,), _scatter_backward(offset_zero=True)),
    Mutant("row_forward_no_allreduce",
           "LinearAllreduce.forward skips RowParallel: each rank's logits are its hidden slice's partial sum",
           "deepspeed.module_inject.layers.LinearAllreduce.forward", "logits",
           (ROW, TIED_ROW, D_ROW, HF_ROW), _row_forward(reduce=False)),
    Mutant("row_bias_before_reduce",
           "LinearAllreduce.forward adds the replicated bias before the all-reduce: the bias is counted tp times",
           "deepspeed.module_inject.layers.LinearAllreduce.forward", "logits (bias cases)",
           (ROW, TIED_ROW), _row_forward(bias_first=True)),
    Mutant("hidden_embedding_weight_detached",
           "HiddenParallelEmbedding.forward looks up weight.detach(): the tied weight gets the projection's "
           "gradient only, not the lookup's (the seed PR's own mutation)",
           "deepspeed.module_inject.layers.HiddenParallelEmbedding.forward", "grad[embed_tokens.weight]",
           (TIED_ROW,), _hidden_embedding(detached=True)),
    Mutant("hidden_embedding_drops_scale_grad_by_freq",
           "HiddenParallelEmbedding.forward looks up without scale_grad_by_freq: a repeated id's lookup gradient "
           "is its count times torch's",
           "deepspeed.module_inject.layers.HiddenParallelEmbedding.forward", "grad[embed_tokens.weight] (sgbf cases)",
           (TIED_ROW,), _hidden_embedding(freq=False)),
    Mutant("hidden_embedding_drops_embed_scale",
           "HiddenParallelEmbedding.forward returns the gathered lookup without Gemma3's embed_scale",
           "deepspeed.module_inject.layers.HiddenParallelEmbedding.forward", "logits / grad (escale_gemma3 cases)",
           (TIED_ROW,), _hidden_embedding(scale=False)),
    Mutant("vocab_embedding_first_row_masked",
           "VocabParallelEmbedding.forward masks input <= vocab_start (off by one): the first token of every "
           "shard is looked up by no rank and embeds to zeros",
           "deepspeed.module_inject.layers.VocabParallelEmbedding.forward", "embedding / logits",
           (TIED_VOCAB, EMBED), _vocab_embedding(first_excluded=True)),
    Mutant("vocab_embedding_no_allreduce",
           "VocabParallelEmbedding.forward returns the masked local lookup without the all-reduce",
           "deepspeed.module_inject.layers.VocabParallelEmbedding.forward", "embedding / logits",
           (TIED_VOCAB, EMBED, HF_TIED, TIED_PLAN), _vocab_embedding(reduce=False)),
    Mutant("vocab_embedding_drops_embed_scale",
           "VocabParallelEmbedding.forward returns the reduced lookup without Gemma3's embed_scale",
           "deepspeed.module_inject.layers.VocabParallelEmbedding.forward", "embedding / logits (escale_gemma3 cases)",
           (TIED_VOCAB, EMBED), _vocab_embedding(scale=False)),
    Mutant("fused_ce_local_sum_exp",
           "_VocabParallelLinearCrossEntropy.forward drops the SUM all-reduce of (exp-sum, target logit): local "
           "denominator, and the target logit only on its owning rank",
           "deepspeed.sequence.linear_cross_entropy._VocabParallelLinearCrossEntropy.forward", "loss",
           (FUSED_CE,), _fused_forward_mutant(reduce_stats=False)),
    Mutant("fused_ce_chunk_targets_from_row0",
           "_VocabParallelLinearCrossEntropy.forward reads each token chunk's targets from row 0 instead of the "
           "chunk start (a chunk-boundary bug: only the first chunk is right)",
           "deepspeed.sequence.linear_cross_entropy._VocabParallelLinearCrossEntropy.forward", "loss (chunk 5)",
           (FUSED_CE,), _fused_forward_mutant(chunk_offset_zero=True)),
    Mutant("fused_ce_hidden_grad_not_reduced",
           "_VocabParallelLinearCrossEntropy.backward skips the all-reduce of the partial hidden gradient",
           "deepspeed.sequence.linear_cross_entropy._VocabParallelLinearCrossEntropy.backward", "hidden_grad",
           (FUSED_CE,), _fused_backward_hidden_not_reduced),
    Mutant("liger_backward_vocab_start_zero",
           "LigerVocabParallelCEFunction's backward takes vocab_start 0 on every rank: rank r>0 subtracts the "
           "one-hot at targets of rank 0's shard",
           "liger_kernel.ops.vocab_parallel_cross_entropy.LigerVocabParallelCEFunction.forward (ctx.vocab_start)",
           "logits_grad", (LIGER_CE, DS_LIGER), _liger_backward_vocab_start_zero),
    Mutant("liger_no_tp_group",
           "LigerVocabParallelCEFunction.forward runs without its tp_group: no all-reduce (local max, sum and "
           "target logit) and vocab_start 0",
           "liger_kernel.ops.vocab_parallel_cross_entropy.LigerVocabParallelCEFunction.forward", "loss",
           (LIGER_CE, DS_LIGER), _liger_local_group),
    Mutant("inference_head_input_offset_zero",
           "LmHeadLinearAllreduce.forward slices the input at hidden offset 0 on every rank: rank r > 0 "
           "multiplies its weight columns by rank 0's slice of the hidden state",
           "deepspeed.module_inject.layers.LmHeadLinearAllreduce.forward", "logits", (INFERENCE,),
           _inference_head_offset_zero),
    Mutant("autotp_accepts_empty_vocab_shard",
           "AutoTP._validate_vocab_parallel_layer without its empty-shard ValueError (vocabulary smaller than "
           "tp): the documented rejection no longer happens where DeepSpeed promises it",
           "deepspeed.module_inject.auto_tp.AutoTP._validate_vocab_parallel_layer",
           "rejection (ds_reject vocab_empty_shard)", (REJECT,), _autotp_accepts_empty_vocab_shard),
    Mutant("tie_fallback_unties",
           "AutoTP's gathered-column tie fallback leaves the head replicated but holding a copy of the embedding's "
           "weight: two Parameters, each trained on its own part of the tied gradient",
           "deepspeed.module_inject.auto_tp.AutoTP._configure_gathered_column_tie_fallbacks",
           "shared_param, then grad / weight of embed_tokens.weight", (TIED_COLUMN, TIED_PLAN), _tie_fallback_unties),
    Mutant("torch_partial_no_allreduce",
           "DTensor's Partial -> Replicate keeps each rank's partial value (no all-reduce): row-parallel logits "
           "and a column head's input gradient stay partial sums",
           "torch.distributed.tensor.placement_types.Partial._reduce_value", "logits / head_input_grad",
           (T_COLUMN, T_VOCAB, T_ROW, ZOO_TRANSFORMERS), _partial_no_allreduce),
    Mutant("torch_loss_parallel_local_sumexp",
           "loss_parallel's _log_softmax drops the SUM all-reduce of the exp-sum: a local softmax denominator",
           "torch.distributed.tensor.parallel.loss._log_softmax", "loss", (T_VOCAB,), _loss_parallel_local_sumexp),
    Mutant("torch_mask_partial_unmasked",
           "_MaskPartial._reduce_value all-reduces without applying the mask: every rank adds its local row 0 "
           "for tokens outside its shard",
           "torch.distributed.tensor.placement_types._MaskPartial._reduce_value", "logits / head_input_grad",
           (T_EMBED,), _mask_partial_unmasked),
    Mutant("megatron_gather_backward_rank0_slice",
           "Megatron's _split_along_last_dim (the backward of gather_from_tensor_model_parallel_region) keeps rank "
           "0's slice on every rank: rank r > 0 trains its vocabulary rows with rank 0's logit gradient",
           "megatron.core.tensor_parallel.mappings._split_along_last_dim", "head_input_grad / grad[lm_head.weight]",
           (M_COLUMN,), _megatron_split_rank0_slice),
    Mutant("megatron_ce_local_sumexp",
           "Megatron's _VocabParallelCrossEntropy.forward drops the SUM all-reduce of sum_exp_logits: a local "
           "softmax denominator", "megatron.core.tensor_parallel.cross_entropy._VocabParallelCrossEntropy.forward",
           "loss", (M_VOCAB,), _megatron_ce_local_sumexp),
    Mutant("megatron_embedding_unmasked",
           "Megatron's VocabParallelEmbedding.forward skips zeroing the lookups of tokens outside the rank's "
           "shard: every rank adds its local row 0 for them", "megatron.core.tensor_parallel.layers."
           "VocabParallelEmbedding.forward", "logits / head_input_grad", (M_EMBED,), _megatron_embedding_unmasked),
    # Precision-only: each is a no-op in fp32 (it rounds to, or stays in, the model dtype), so only the
    # bf16/fp16 cases of a family can kill it.
    Mutant("ce_softmax_in_logits_dtype",
           "_VocabParallelCrossEntropy.forward without the fp32 upcast: max, exp, sum-exp, log and the target "
           "logit in bf16/fp16, and a bf16/fp16 loss",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "contract[loss] / loss",
           (VOCAB, DS_CE, TIED_VOCAB), _ce_forward_mutant(upcast=False)),
    Mutant("ce_sum_exp_allreduce_in_logits_dtype",
           "_VocabParallelCrossEntropy.forward rounds the partial exp-sums to the logits dtype for their SUM "
           "all-reduce (a bandwidth 'optimisation'), then back to fp32",
           "deepspeed.sequence.cross_entropy._VocabParallelCrossEntropy.forward", "loss",
           (VOCAB, DS_CE, TIED_VOCAB), _ce_forward_mutant(sum_exp_in_logits_dtype=True)),
    Mutant("ops_softmax_stats_local_max",
           "vocab_parallel_ops._softmax_stats leaves out the row maxima's MAX all-reduce: every rank shifts its "
           "exp-sum by its own maximum, and the all-reduced sum mixes the shifts",
           "deepspeed.sequence.vocab_parallel_ops._softmax_stats", "loss / collectives",
           (DS_LOGPROBS, DS_ENTROPY, DS_KL), _ops_stats_local_max),
    Mutant("ops_kl_ignores_reverse",
           "vocab_parallel_kl_div drops its reverse argument: always the forward KL(teacher || student)",
           "deepspeed.sequence.vocab_parallel_ops.vocab_parallel_kl_div", "loss (reverse cases)", (DS_KL,),
           _ops_kl_ignores_reverse),
    Mutant("ops_kl_backward_uncentred",
           "_VocabParallelKLDiv.backward leaves the KL out of the weighted side's gradient: p_A (log p_A - log p_B) "
           "instead of p_A (log p_A - log p_B - KL)",
           "deepspeed.sequence.vocab_parallel_ops._VocabParallelKLDiv.backward", "student_grad / teacher_grad",
           (DS_KL,), _ops_kl_backward_uncentred),
    Mutant("ce_sp_sum_local",
           "_global_sp_sum skips the SP all-reduce: with sp_group a rank's loss is its chunk's sum (or, for a mean, "
           "its chunk's sum over the sequence's count)",
           "deepspeed.sequence.cross_entropy._global_sp_sum", "loss (sp 2)", (DS_CE, DS_SEQ_CE, FUSED_CE),
           _sp_sum_local),
    Mutant("seq_ce_gather_sums_gradients",
           "vocab_sequence_parallel_cross_entropy gathers the per-token loss with sum_gradients=True (the "
           "reduce-scatter of vocab_parallel_cross_entropy's gather) instead of the legacy local slice",
           "deepspeed.sequence.cross_entropy.vocab_sequence_parallel_cross_entropy", "logits_grad", (DS_SEQ_CE,),
           _seq_ce_sums_gradients),
    Mutant("ce_module_drops_ignore_index",
           "VocabParallelCrossEntropyLoss.forward does not pass its ignore_index on: the function's default -100",
           "deepspeed.sequence.cross_entropy.VocabParallelCrossEntropyLoss.forward", "loss", (DS_CE_MODULE,),
           _ce_module_drops_ignore_index),
    Mutant("ops_logprobs_backward_no_target_term",
           "_VocabParallelLogProbs.backward drops the requested ids' own term (onehot): the logits gradient is "
           "-softmax x upstream alone",
           "deepspeed.sequence.vocab_parallel_ops._VocabParallelLogProbs.backward", "logits_grad", (DS_LOGPROBS,),
           _ops_logprobs_backward_no_target_term),
    Mutant("ce_reduced_in_logits_dtype",
           "vocab_parallel_cross_entropy sums (and averages) the per-token losses in the logits dtype instead of "
           "the fp32 the CE returns: a bf16/fp16 loss",
           "deepspeed.sequence.cross_entropy.vocab_parallel_cross_entropy", "contract[loss] / loss",
           (VOCAB, DS_CE, TIED_VOCAB), _ce_reduced_in_logits_dtype),
    Mutant("add_bias_in_fp32",
           "add_bias adds the bias upcast to fp32 (an 'accuracy' fix): a bf16/fp16 head hands back fp32 logits",
           "deepspeed.module_inject.layers.add_bias", "contract[logits] (bias cases)", (COLUMN, VOCAB),
           _add_bias_in_fp32),
    Mutant("fused_ce_stats_in_input_dtype",
           "_VocabParallelLinearCrossEntropy.forward allocates the per-token loss (and the row max and exp-sum "
           "saved for backward) in the input dtype instead of fp32: a bf16/fp16 per-token loss",
           "deepspeed.sequence.linear_cross_entropy._VocabParallelLinearCrossEntropy.forward",
           "contract[loss] (reduction none)", (FUSED_CE,), _fused_forward_mutant(stats_in_input_dtype=True)),
    Mutant("fused_ce_ignores_autocast",
           "vocab_parallel_linear_cross_entropy ignores the active autocast dtype (_autocast_dtype answers None): "
           "inside a user's torch.autocast its GEMMs run in float32 on float32 inputs, numbers within bf16's bounds",
           "deepspeed.sequence.linear_cross_entropy._autocast_dtype", "gemm_dtype (autocast cases)", (FUSED_CE,),
           _fused_ce_ignores_autocast,
           cases=("ds_fused_linear_ce-fp32-mean-v35-nobias-chunk5-ign_scattered-tp2-cpu-autocast_bf16",)),
    Mutant("unfused_master_in_model_dtype",
           "FP16_UnfusedOptimizer.step (ZeRO 0, bf16/fp16) rounds its fp32 master weights to the model dtype after "
           "every update: small updates round away as in a pure-bf16 optimizer",
           "deepspeed.runtime.fp16.unfused_optimizer.FP16_UnfusedOptimizer.step", "weight / sgd_update",
           (COLUMN, VOCAB), _unfused_master_in_model_dtype),
    # fp16 dynamic loss scaling only (cases/deepspeed_loss_scale.toml): a static scale never overflows.
    Mutant("loss_scaler_ignores_hysteresis",
           "DynamicLossScaler.update_scale (ZeRO 1-3) halves the scale at every overflow: fp16.hysteresis parsed and "
           "never applied (what ZeRO 0's optimizers do)",
           "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler.update_scale", "rank_decisions (hysteresis 2)",
           (COLUMN,), _loss_scaler_ignores_hysteresis,
           cases=("column_gathered-fp16-mean-v34-h32-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-ls_dyn19",)),
    Mutant("fused_ce_hidden_grad_in_input_dtype",
           "_VocabParallelLinearCrossEntropy.backward accumulates the hidden gradient over vocabulary blocks, and "
           "all-reduces it, in the input dtype instead of fp32",
           "deepspeed.sequence.linear_cross_entropy._VocabParallelLinearCrossEntropy.backward", "hidden_grad",
           (FUSED_CE,), _fused_backward_hidden_grad_in_input_dtype,
           equivalent=("within parity with plain PyTorch, the suite's contract: the unfused bf16 reference rounds "
                       "the logits gradient to bf16 before its product, and torch's default "
                       "allow_bf16_reduced_precision_reduction lets a plain bf16 GEMM round split-K partial sums "
                       "to bf16 (tolerances.SPLIT_K_ROUNDINGS), as the mutant rounds its few per-block partial "
                       "sums; hidden_grad ratio 0.29 -> 0.41. Killing it needs DeepSpeed's own fp32 accumulation "
                       "as the contract, which plain PyTorch does not promise")),
    Mutant("uc_restore_rank0_slice",
           "load_hp_checkpoint_state slices every universal tensor for TP rank 0: each resumed rank gets rank 0's "
           "rows (or hidden columns) of the head",
           "deepspeed.checkpoint.universal_checkpoint.load_hp_checkpoint_state",
           "resumed[lm_head.weight.*] on TP ranks > 0", (UC_COLUMN, UC_VOCAB, UC_ROW), _uc_restore_rank0_slice),
    Mutant("uc_moments_zeroed",
           "load_hp_checkpoint_state restores the weights but hands AdamW zero moments, as a fresh optimizer has",
           "deepspeed.checkpoint.universal_checkpoint.load_hp_checkpoint_state",
           "resumed[*.exp_avg] / resumed[*.exp_avg_sq], then weight", (UC_COLUMN, UC_VOCAB, UC_ROW),
           _uc_moments_zeroed),
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


def register(*mutants: Mutant) -> None:
    """Add mutants of a subject module's own code (one brought in through PARITY_SUBJECT_MODULES declares them at
    import, so parent and rank processes both know them)."""
    for m in mutants:
        if m.name in BY_NAME:
            raise ValueError(f"mutant {m.name!r} is already in the catalog")
        MUTANTS.append(m)
        BY_NAME[m.name] = m


def mutants() -> list[Mutant]:
    """Every mutant: the catalog's and those the registered subject modules added (importing the registry
    imports them)."""
    import parity.subjects  # noqa: F401

    return MUTANTS


def get(name: str) -> Mutant:
    mutants()
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(BY_NAME)}") from None


def apply_named(name: str, where: str = "rank"):
    """Called once at process start with the run's mutant (RunSettings.mutant, PARITY_MUTANT):
    apply it if it names a mutant of this process kind ("rank" or "parent")."""
    if not name:
        return None
    mutant = get(name)
    if mutant.where != where:
        return None
    mutant.apply()
    print(f"=== mutant applied: {mutant.name} ({mutant.replaces})", flush=True)
    return mutant
