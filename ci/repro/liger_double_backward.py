"""Liger-Kernel LigerVocabParallelCEFunction: a second retained-graph backward is silently wrong.

Standalone (torch + liger-kernel only), CPU, 2 processes over gloo, Triton kernels in the
interpreter (TRITON_INTERPRET=1, set below before anything imports triton):

    python ci/repro/liger_double_backward.py

Each rank holds half of the vocabulary of a [24, 32] logits tensor, computes per-token vocabulary-
parallel CE with LigerVocabParallelCEFunction, and calls loss.backward(retain_graph=True) twice
with the same upstream weights. Autograd semantics: the accumulated logits gradient must be
exactly 2x the single-backward gradient. Liger's backward writes the gradient into the exp buffer
it saved in forward (and, in fp32, returns that very buffer as grad_input), so the second backward
reads the first backward's output as if it were exp(logits - max): no error, a wrong gradient.
The expected gradient is computed with plain torch on the full (gathered) logits.
Exit status: 1 when the gradients differ (the bug reproduces), 0 when they match.

Finding: findings/liger_double_backward.toml
"""
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

WORLD, TOKENS, VOCAB, IGNORE = 2, 24, 32, -100


def inputs():
    gen = torch.Generator().manual_seed(4321)
    logits = 3 * torch.randn(TOKENS, VOCAB, generator=gen)
    target = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    upstream = torch.rand(TOKENS, generator=gen) + 0.5
    return logits, target, upstream


def worker(rank, result):
    from liger_kernel.ops.vocab_parallel_cross_entropy import LigerVocabParallelCEFunction

    logits, target, upstream = inputs()
    local_vocab = VOCAB // WORLD
    local = logits[:, rank * local_vocab:(rank + 1) * local_vocab].contiguous().requires_grad_(True)
    loss = LigerVocabParallelCEFunction.apply(local.view(TOKENS, 1, local_vocab), target.view(TOKENS, 1),
                                              dist.group.WORLD, IGNORE, 0.0, "pytorch", "global").view(TOKENS)
    objective = (loss * upstream).sum()
    objective.backward(retain_graph=True)
    once = local.grad.clone()
    objective.backward(retain_graph=True)  # second retained-graph backward: autograd accumulates
    result[rank] = (once.tolist(), local.grad.tolist())  # plain lists: no shared memory


def main():
    got = {r: (torch.tensor(once), torch.tensor(twice)) for r, (once, twice) in run_ranks(worker, WORLD).items()}

    logits, target, upstream = inputs()
    x = logits.double().requires_grad_(True)
    torch.nn.functional.cross_entropy(x, target, reduction="none").mul(upstream.double()).sum().backward()
    expected_once = x.grad
    once = torch.cat([got[r][0] for r in range(WORLD)], dim=1).double()
    twice = torch.cat([got[r][1] for r in range(WORLD)], dim=1).double()
    err_once = (once - expected_once).abs().max().item()
    err_twice = (twice - 2 * expected_once).abs().max().item()
    torch.set_printoptions(precision=5, linewidth=140)
    print(f"liger-kernel {__import__('importlib.metadata').metadata.version('liger-kernel')}, "
          f"torch {torch.__version__}, {WORLD} ranks over gloo, TRITON_INTERPRET=1")
    print(f"one backward:  max |grad - expected| = {err_once:.3e}")
    print(f"two backwards: max |grad - 2*expected| = {err_twice:.3e}")
    print("token 0, first 6 columns of the vocabulary:")
    print("  expected after two backwards:", (2 * expected_once)[0, :6])
    print("  Liger after two backwards:   ", twice[0, :6])
    wrong = err_once > 1e-5 or err_twice > 1e-5
    print("BUG REPRODUCED: the second retained-graph backward gives a wrong gradient" if wrong
          else "gradients match: not reproduced")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
