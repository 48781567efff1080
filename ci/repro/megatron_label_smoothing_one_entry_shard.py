"""megatron-core 0.16.1: label smoothing on a one-entry vocabulary shard divides by zero.

``_VocabParallelCrossEntropy.forward`` (tensor_parallel/cross_entropy.py) computes
``smoothing = label_smoothing * vocab_size / (vocab_size - 1)`` with ``vocab_size`` the rank's
partition width (the local-vocabulary bug of megatron_label_smoothing_local_vocab.py). Where tp equals
the vocabulary, every rank holds one entry and the call raises ZeroDivisionError; plain torch's
F.cross_entropy(label_smoothing=0.1) over the same two classes is a number. Found by parity explore
(vocab 2 over tp 2). Run (CPU, about 15 s):
    python ci/repro/megatron_label_smoothing_one_entry_shard.py
Exit status 1 while the TP=2 call raises, 0 once it returns a loss.

Finding: findings/megatron_label_smoothing_local_vocab.toml
"""
import os
import sys
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, TOKENS, ALPHA = 2, 2, 6, 0.1


def rank_main(rank, result):
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP, create_gloo_process_groups=False)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(TOKENS, VOCAB, generator=gen)
    target = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    local = logits[:, rank:rank + 1].clone()
    try:
        loss = vocab_parallel_cross_entropy(local[:, None], target[:, None], label_smoothing=ALPHA)
        result[rank] = f"loss {loss.squeeze(1).tolist()}"
    except ZeroDivisionError as exc:
        result[rank] = f"ZeroDivisionError: {exc}"
    parallel_state.destroy_model_parallel()


def main() -> int:
    gen = torch.Generator().manual_seed(0)  # the ranks' draws
    logits = torch.randn(TOKENS, VOCAB, generator=gen)
    target = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    print(f"unsharded F.cross_entropy(label_smoothing={ALPHA}, reduction='none'):",
          F.cross_entropy(logits, target, label_smoothing=ALPHA, reduction="none").tolist())
    result = run_ranks(rank_main, TP)
    for rank in range(TP):
        print(f"rank {rank}: {result[rank]}")
    raised = any(str(r).startswith("ZeroDivisionError") for r in result.values())
    print("label smoothing divides by zero on a one-entry shard" if raised else "no error")
    return 1 if raised else 0


if __name__ == "__main__":
    sys.exit(main())
