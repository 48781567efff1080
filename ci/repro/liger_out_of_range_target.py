"""Liger-Kernel 0.8.5: LigerVocabParallelCEFunction accepts a target outside the vocabulary.

A non-ignored target equal to the vocabulary size belongs to no shard. torch's cross_entropy raises
(IndexError on CPU, a device assert on CUDA) and DeepSpeed's vocab_parallel_cross_entropy raises
ValueError("Target is out of range ..."); Liger returns a finite loss for that token.

Run (CPU through Triton's interpreter, about 15 s):  python ci/repro/liger_out_of_range_target.py
Exit status 1 while Liger accepts the target, 0 once it raises.

Finding: findings/liger_out_of_range_target.toml
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Liger's kernels are defined

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, TOKENS, VOCAB = 2, 8, 32


def rank_main(rank, result):
    os.environ["TRITON_INTERPRET"] = "1"
    from liger_kernel.ops.vocab_parallel_cross_entropy import LigerVocabParallelCEFunction

    logits = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(1))
    targets[2] = VOCAB  # out of range, not the ignore index
    local = VOCAB // TP
    shard = logits[:, rank * local:(rank + 1) * local].contiguous()
    try:
        loss = LigerVocabParallelCEFunction.apply(shard.view(TOKENS, 1, local), targets.view(TOKENS, 1),
                                                  dist.group.WORLD, -100, 0.0, "pytorch", "global").view(TOKENS)
        outcome = f"no error; loss for the out-of-range token = {float(loss[2]):.6f}"
    except Exception as exc:  # noqa: BLE001 - any rejection is the fixed behaviour
        outcome = f"raised {type(exc).__name__}: {exc}"
    if rank == 0:
        result["liger"] = outcome


if __name__ == "__main__":
    result = run_ranks(rank_main, TP)
    try:
        torch.nn.functional.cross_entropy(torch.randn(1, VOCAB), torch.tensor([VOCAB]))
        torch_outcome = "no error"
    except Exception as exc:  # noqa: BLE001
        torch_outcome = f"raised {type(exc).__name__}"
    print(f"torch.nn.functional.cross_entropy: {torch_outcome}")
    print(f"LigerVocabParallelCEFunction:      {result['liger']}")
    sys.exit(1 if result["liger"].startswith("no error") else 0)
