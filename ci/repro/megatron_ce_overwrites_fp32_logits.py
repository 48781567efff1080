"""megatron-core 0.16.1: vocab_parallel_cross_entropy overwrites float32 logits with the softmax.

``VocabParallelCrossEntropy.calculate_logits_max`` calls ``logits.float()``, which for float32 logits
is the caller's tensor itself; ``calculate_predicted_logits`` then subtracts the row max in place and
``torch.exp(..., out=...)`` and ``exp_logits.div_(...)`` turn it into the softmax. The Function does
not mark its input dirty, so autograd raises nothing: a user who keeps the logits (for metrics, a
second loss, logging) silently holds probabilities instead. bf16/fp16 logits are copied by
``.float()`` and stay intact. F.cross_entropy never writes its input.

Run (CPU, gloo, TP=2, about 20 s):  python ci/repro/megatron_ce_overwrites_fp32_logits.py
Exit status 1 while the fp32 logits are changed by the loss call, 0 once they are left alone.

Finding: findings/megatron_ce_overwrites_fp32_logits.toml
"""
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, TOKENS = 2, 8, 6


def rank_main(rank, result):
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP, create_gloo_process_groups=False)
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(TOKENS, 1, VOCAB, generator=gen)
    target = torch.randint(0, VOCAB, (TOKENS, 1), generator=gen)
    width = VOCAB // TP
    for dtype in (torch.float32, torch.bfloat16):
        logits = full[..., rank * width:(rank + 1) * width].to(dtype).requires_grad_()
        before = logits.detach().clone()
        vocab_parallel_cross_entropy(logits, target).sum().backward()
        result[(rank, str(dtype))] = float((logits.detach().float() - before.float()).abs().max())
    parallel_state.destroy_model_parallel()


def main() -> int:
    result = run_ranks(rank_main, TP)
    changed = False
    for (rank, dtype), gap in sorted(result.items()):
        print(f"rank {rank} {dtype}: max |logits after the loss - logits before| = {gap:.3e}")
        changed |= dtype == "torch.float32" and gap > 0
    print("fp32 logits overwritten by the loss" if changed else "logits left intact")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
