"""Liger-Kernel 0.8.5: LigerVocabParallelCEFunction's label smoothing differs from torch's except in
formula "pytorch" with mode "global".

torch's F.cross_entropy(label_smoothing=a) puts a/V on every class of the whole vocabulary:
loss = (1 - a) * CE + a * mean over all V classes of -log p. Liger's two options change that
(ops/vocab_parallel_cross_entropy.py:284-303, backward :156-162):
- label_smoothing_formula="megatron" (NeMo's): a_eff = a * K / (K - 1), so the target gets 1 - a and
  every other class a / (K - 1). Intended by Liger (it is Megatron-LM's formula), and different from
  torch by a factor K / (K - 1) on the smoothing term: a different loss, a different gradient.
- label_smoothing_mode="partition": K and the mean of -log p are taken over the rank's own shard (V/TP
  columns, no all-reduce), so each TP rank computes a different loss for the same token, and each rank's
  gradient subtracts a / (V/TP) instead of a / V.

Run (CPU through Triton's interpreter, TP 2, vocabulary 32, about 20 s):
python ci/repro/liger_label_smoothing_formula_mode.py
Prints, per (formula, mode), the largest |loss - F.cross_entropy(label_smoothing=0.1)| on each rank and the
largest gradient difference. Exit status 1 while any option other than ("pytorch", "global") differs from
torch, 0 once they all agree (as the torch semantics of label_smoothing would have it).

Finding: findings/liger_label_smoothing_formula_mode.toml
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Liger's kernels are defined

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, TOKENS, VOCAB, ALPHA, IGNORE = 2, 8, 32, 0.1, -100
OPTIONS = [("pytorch", "global"), ("megatron", "global"), ("pytorch", "partition"), ("megatron", "partition")]


def inputs():
    logits = 3 * torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(1))
    targets[1] = IGNORE
    return logits, targets


def rank_main(rank, result):
    os.environ["TRITON_INTERPRET"] = "1"
    from liger_kernel.ops.vocab_parallel_cross_entropy import LigerVocabParallelCEFunction

    logits, targets = inputs()
    local = VOCAB // TP
    for formula, mode in OPTIONS:
        shard = logits[:, rank * local:(rank + 1) * local].contiguous().requires_grad_(True)
        loss = LigerVocabParallelCEFunction.apply(shard.view(TOKENS, 1, local), targets.view(TOKENS, 1),
                                                  dist.group.WORLD, IGNORE, ALPHA, formula, mode).view(TOKENS)
        loss.sum().backward()
        result[(rank, formula, mode)] = (loss.detach(), shard.grad.clone())


if __name__ == "__main__":
    result = run_ranks(rank_main, TP)
    logits, targets = inputs()
    full = logits.clone().requires_grad_(True)
    want = torch.nn.functional.cross_entropy(full, targets, ignore_index=IGNORE, label_smoothing=ALPHA,
                                             reduction="none")
    want.sum().backward()
    local = VOCAB // TP
    differs = False
    print(f"F.cross_entropy(label_smoothing={ALPHA}) loss[:3] = {[round(x, 4) for x in want[:3].tolist()]}")
    for formula, mode in OPTIONS:
        parts = []
        for rank in range(TP):
            loss, grad = result[(rank, formula, mode)]
            loss_err = float((loss - want.detach()).abs().max())
            grad_err = float((grad - full.grad[:, rank * local:(rank + 1) * local]).abs().max())
            parts.append(f"rank {rank}: max |loss - torch| = {loss_err:.4g}, max |grad - torch| = {grad_err:.4g}, "
                         f"loss[:3] = {[round(x, 4) for x in loss[:3].tolist()]}")
            if (formula, mode) != ("pytorch", "global") and (loss_err > 1e-5 or grad_err > 1e-6):
                differs = True
        print(f"formula {formula!r}, mode {mode!r}:\n  " + "\n  ".join(parts))
    print("DIFFERS from torch: the options other than (pytorch, global)" if differs
          else "every option agrees with F.cross_entropy(label_smoothing)")
    sys.exit(1 if differs else 0)
