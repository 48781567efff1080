"""DeepSpeed 0.19.8: vocab_parallel_kl_div accepts a teacher sharded differently from the student, silently.

``deepspeed.sequence.vocab_parallel_ops`` says "Teacher and student logits passed to the KL op must be
sharded identically: same tensor-parallel group and same vocabulary range on every rank", but
``vocab_parallel_kl_div`` checks only that the two local tensors have the same shape (ValueError "must have
the same shape and vocabulary sharding"); it takes no shard bounds and gathers none, where
``vocab_parallel_logprobs`` and ``vocab_parallel_cross_entropy`` all-gather every rank's bounds and refuse a
bad layout. A teacher whose shards hold other vocabulary ids with the same widths (here every rank's bounds
one column on, as an off-by-one in a teacher's own vocab-parallel head or a differently padded vocabulary
would give) is paired token id against the wrong token id: the per-token KL and both gradients are finite and
wrong, with no error on any rank.

Plain PyTorch (what the user means): the per-token KL(teacher || student) of the full logits,
F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="none").sum(-1).

Run (CPU, 2 gloo ranks, ~15 s): python ci/repro/deepspeed_kl_div_unchecked_shards.py
Exit status 1 while the misaligned teacher is accepted with a wrong KL, 0 once every rank raises.

Finding: findings/deepspeed_kl_div_unchecked_shards.toml
"""
import importlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, TOKENS = 2, 32, 6


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.distributed as dist
    from deepspeed.sequence.vocab_parallel_ops import vocab_parallel_kl_div

    deepspeed.init_distributed(dist_backend="gloo")
    gen = torch.Generator().manual_seed(0)
    student = 3 * torch.randn(TOKENS, VOCAB, generator=gen)
    teacher = student + 2 * torch.randn(TOKENS, VOCAB, generator=gen)
    width = VOCAB // TP
    ids = torch.arange(rank * width, (rank + 1) * width)
    aligned = vocab_parallel_kl_div(student[:, ids], teacher[:, ids], tp_group=dist.group.WORLD)
    try:  # the teacher's shard one vocabulary id on (same width): ids start+1 .. end, wrapping
        shifted = vocab_parallel_kl_div(student[:, ids], teacher[:, (ids + 1) % VOCAB], tp_group=dist.group.WORLD)
        outcome = shifted.tolist()
    except ValueError as exc:
        outcome = f"ValueError: {exc}"
    want = F.kl_div(F.log_softmax(student, -1), F.log_softmax(teacher, -1), log_target=True,
                    reduction="none").sum(-1)
    result[rank] = (aligned.tolist(), outcome, want.tolist())


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    accepted = False
    for rank in range(TP):
        aligned, outcome, want = result[rank]
        print(f"rank {rank}: identical shards: max |KL - torch| = "
              f"{max(abs(a - w) for a, w in zip(aligned, want)):.2e}")
        if isinstance(outcome, str):
            print(f"rank {rank}: teacher shards one id on: {outcome}")
        else:
            accepted = True
            print(f"rank {rank}: teacher shards one id on: accepted, KL[:3] = {[round(x, 3) for x in outcome[:3]]} "
                  f"(torch: {[round(x, 3) for x in want[:3]]}), max |KL - torch| = "
                  f"{max(abs(a - w) for a, w in zip(outcome, want)):.3g}")
    print("ACCEPTED: a differently sharded teacher gives a wrong KL without an error" if accepted
          else "every rank refused the differently sharded teacher")
    sys.exit(1 if accepted else 0)
