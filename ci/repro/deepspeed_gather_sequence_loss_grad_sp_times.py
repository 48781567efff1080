"""DeepSpeed 0.19.8: vocab_parallel_cross_entropy(gather_sequence_loss=True) gives SP times the logits gradient.

With ``sp_group`` and ``gather_sequence_loss=True`` (reduction "none"), ``vocab_parallel_cross_entropy`` returns
the whole sequence's per-token loss on every SP rank (an all-gather over the SP group, cross_entropy.py:263), the
same tensor everywhere. A user computes the sequence's objective from it on every rank, as without sequence
parallelism, and backpropagates. Its backward (``_GatherSequenceLoss`` with ``sum_gradients=True``,
cross_entropy.py:127-131) reduce-scatters the incoming gradient, summing every SP rank's copy of the same
objective's gradient, so each rank's logits gradient is SP times its slice of the true one, without a word.
``vocab_sequence_parallel_cross_entropy`` with the same flag (its default) takes the rank's own slice
(``sum_gradients=False``, "the legacy local-slice gradient") and gives the true gradient; the two documented
entry points to one option differ by a factor SP.

Plain PyTorch (what the user means): F.cross_entropy(full logits, targets, reduction="none") weighted per token
and summed; each rank's gradient is its (sequence chunk, vocabulary shard) block of the full logits gradient.
The forward is right: the gathered loss equals torch's per-token loss.

Run (CPU, 4 gloo ranks = TP 2 x SP 2, ~20 s): python ci/repro/deepspeed_gather_sequence_loss_grad_sp_times.py
Exit status 1 while the gathered loss's gradient is not the true one.

Finding: findings/deepspeed_gather_sequence_loss_grad_sp_times.toml
"""
import importlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, SP, VOCAB, TOKENS = 2, 2, 32, 8


def inputs():
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(TOKENS, VOCAB, generator=gen)
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    targets[[1, 2]] = -100
    weights = torch.rand(TOKENS, generator=gen) + 0.5  # a per-token weighting of the sequence's losses
    return logits, targets, weights


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.distributed as dist
    from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy, vocab_sequence_parallel_cross_entropy

    deepspeed.init_distributed(dist_backend="gloo")
    # TP groups: consecutive ranks; SP groups: the ranks of one TP rank. Every rank makes every group, in order.
    tp_groups = [dist.new_group([s * TP + t for t in range(TP)]) for s in range(SP)]
    sp_groups = [dist.new_group([t + TP * s for s in range(SP)]) for t in range(TP)]
    tp_rank, sp_rank = rank % TP, rank // TP
    width, chunk = VOCAB // TP, TOKENS // SP
    cols, rows = slice(tp_rank * width, (tp_rank + 1) * width), slice(sp_rank * chunk, (sp_rank + 1) * chunk)
    logits, targets, weights = inputs()
    out = {}
    for name, fn in (("vocab_parallel_cross_entropy", vocab_parallel_cross_entropy),
                     ("vocab_sequence_parallel_cross_entropy", vocab_sequence_parallel_cross_entropy)):
        local = logits[rows, cols].clone().requires_grad_(True)
        loss = fn(local, targets[rows], tp_group=tp_groups[sp_rank], sp_group=sp_groups[tp_rank],
                  vocab_start_index=cols.start, vocab_end_index=cols.stop, reduction="none",
                  gather_sequence_loss=True)
        (loss * weights).sum().backward()
        out[name] = (loss.detach(), local.grad)
    x = logits.clone().requires_grad_(True)
    want_loss = F.cross_entropy(x, targets, reduction="none")
    (want_loss * weights).sum().backward()
    result[rank] = {name: (float((loss - want_loss.detach()).abs().max()),
                           float(grad.norm() / x.grad[rows, cols].norm()),
                           float((grad - x.grad[rows, cols]).abs().max()))
                    for name, (loss, grad) in out.items()}


if __name__ == "__main__":
    result = run_ranks(rank_main, TP * SP, env={"DS_ACCELERATOR": "cpu"})
    wrong = False
    for rank in range(TP * SP):
        for name, (loss_err, ratio, grad_err) in result[rank].items():
            print(f"rank {rank} (tp {rank % TP}, sp {rank // TP}) {name}(gather_sequence_loss=True): "
                  f"max |loss - torch| = {loss_err:.1e}, |grad| / |torch grad| = {ratio:.4f}, "
                  f"max |grad - torch grad| = {grad_err:.3g}")
            wrong |= grad_err > 1e-5 or loss_err > 1e-5
    print(f"WRONG: a rank's logits gradient is not its block of torch's (SP = {SP})" if wrong
          else "every rank's logits gradient is its block of torch's")
    sys.exit(1 if wrong else 0)
