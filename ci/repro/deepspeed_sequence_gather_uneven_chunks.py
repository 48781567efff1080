"""DeepSpeed 0.19.8: the sequence-parallel loss gather takes unequal chunks unchecked; on gloo a rank aborts.

`vocab_sequence_parallel_cross_entropy` (its default `gather_sequence_loss=True`) and
`vocab_parallel_cross_entropy(..., gather_sequence_loss=True)` all-gather every SP rank's per-token loss with
`_GatherSequenceLoss` (`sequence/cross_entropy.py:107-119`), which sizes the output as its own chunk length times
the SP size and checks nothing: chunks of unequal length (a sequence the SP size does not divide; here 5 and 3
tokens over SP 2) reach `all_gather_into_tensor` with different sizes. On gloo that kills a rank with SIGABRT
("gloo::EnforceNotMet ... Received data size doesn't match expected size") instead of raising a ValueError; the
other rank is lost with it. Plain torch computes the whole sequence's per-token loss. Without the gather (sum and
mean over the sequence) unequal chunks are right (the `sp_chunks = "uneven"` cases in cases/deepspeed_ce.toml).
A crash, loud; on NCCL not tried.

Run (CPU, 2 ranks, about 15 s):  python ci/repro/deepspeed_sequence_gather_uneven_chunks.py
Exit status 1 while a rank dies (or the call is accepted) on unequal chunks, 0 once every rank raises an error.

Finding: findings/deepspeed_sequence_gather_uneven_chunks.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

SP, VOCAB, CHUNKS = 2, 10, (5, 3)  # no TP: each rank holds the whole vocabulary of its chunk


def rank_main(rank, result, wrapper):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.distributed as dist
    from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy, vocab_sequence_parallel_cross_entropy

    deepspeed.init_distributed(dist_backend="gloo")
    gen = torch.Generator().manual_seed(0)
    logits, target = torch.randn(sum(CHUNKS), VOCAB, generator=gen), torch.randint(0, VOCAB, (sum(CHUNKS),), generator=gen)
    rows = slice(sum(CHUNKS[:rank]), sum(CHUNKS[:rank + 1]))
    local = logits[rows].clone().requires_grad_(True)
    try:
        if wrapper:
            loss = vocab_sequence_parallel_cross_entropy(local, target[rows], dist.group.WORLD)
        else:
            loss = vocab_parallel_cross_entropy(local, target[rows], sp_group=dist.group.WORLD, reduction="none",
                                                gather_sequence_loss=True)
        result[rank] = f"accepted: per-token loss of {tuple(loss.shape)} (the sequence has {sum(CHUNKS)} tokens)"
    except Exception as error:  # a refusal is the outcome wanted
        result[rank] = f"raised {type(error).__name__}: {error}"


if __name__ == "__main__":
    refused = True
    for wrapper in (True, False):
        name = ("vocab_sequence_parallel_cross_entropy (defaults)" if wrapper else
                "vocab_parallel_cross_entropy(gather_sequence_loss=True)")
        try:
            got = run_ranks(rank_main, SP, wrapper, env={"DS_ACCELERATOR": "cpu"}, init=False, timeout=120)
            print(f"{name}, chunks {CHUNKS}: " + "; ".join(f"rank {r}: {v}" for r, v in sorted(got.items())))
            refused &= all(v.startswith("raised") for v in got.values()) and len(got) == SP
        except Exception as error:  # a rank died (torch.multiprocessing's ProcessExitedException) or hung
            print(f"{name}, chunks {CHUNKS}: a rank died: {type(error).__name__}: {str(error).splitlines()[0]}")
            refused = False
    print("every rank refused unequal chunks" if refused else
          "DIFFERS: unequal sequence chunks reach the gather unchecked (torch computes the sequence's loss)")
    sys.exit(0 if refused else 1)
