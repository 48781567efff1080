"""megatron-core 0.16.1: vocab_parallel_cross_entropy smooths labels over the *local* vocabulary shard.

``_VocabParallelCrossEntropy.forward`` (tensor_parallel/cross_entropy.py) takes
``vocab_size = exp_logits.size(-1)`` (the rank's partition, V/TP) and ``log_probs.mean(dim=-1)``
over the partition only, with no all-reduce; backward uses ``1 / vocab_size`` of the partition too.
So with label_smoothing > 0 the loss depends on TP and differs between ranks, where one process
(TP=1) gives one loss for everyone (Megatron-LM issues #737 and #7464 report this bug).

This script runs TP=2 over gloo on CPU and compares each rank's per-token loss with Megatron's own
formula evaluated over the whole vocabulary in plain torch (smoothing = a*K/(K-1), K = full vocab;
NeMo's convention, which also differs from torch's F.cross_entropy(label_smoothing=a):
(1-a)*nll + a*mean(-log p)). It prints both gaps. Run (CPU, about 20 s):
    python ci/repro/megatron_label_smoothing_local_vocab.py
Exit status 1 while the TP=2 loss differs from the full-vocabulary formula, 0 once it agrees.

Finding: findings/megatron_label_smoothing_local_vocab.toml
"""
import os
import sys
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, TOKENS, ALPHA = 2, 8, 6, 0.1


def full_vocab_megatron_formula(logits, target):
    log_p = logits.log_softmax(-1)
    nll = -log_p.gather(-1, target[:, None]).squeeze(-1)
    smoothing = ALPHA * VOCAB / (VOCAB - 1)
    return (1 - smoothing) * nll - smoothing * log_p.mean(-1)


def rank_main(rank, result):
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP, create_gloo_process_groups=False)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(TOKENS, VOCAB, generator=gen, dtype=torch.float64)
    target = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    width = VOCAB // TP
    local = logits[:, rank * width:(rank + 1) * width].float().clone()
    loss = vocab_parallel_cross_entropy(local[:, None], target[:, None], label_smoothing=ALPHA).squeeze(1)
    want = full_vocab_megatron_formula(logits, target)
    torch_ls = F.cross_entropy(logits, target, label_smoothing=ALPHA, reduction="none")
    result[rank] = (float((loss.double() - want).abs().max()), float((loss.double() - torch_ls).abs().max()))
    parallel_state.destroy_model_parallel()


def main() -> int:
    result = run_ranks(rank_main, TP)
    bad = False
    for rank in range(TP):
        vs_formula, vs_torch = result[rank]
        print(f"rank {rank}: max |loss - Megatron formula over full vocab| = {vs_formula:.3e}; "
              f"max |loss - F.cross_entropy(label_smoothing={ALPHA})| = {vs_torch:.3e}")
        bad |= vs_formula > 1e-5
    print("label smoothing uses the local vocabulary shard" if bad else "label smoothing is global")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
