"""DeepSpeed 0.19.8: a vocabulary-parallel CE whose targets are all ignored returns 0 where torch returns nan.

Plain PyTorch / Hugging Face (what a user without tensor parallelism gets):
- mean: F.cross_entropy(reduction="mean") over targets that are all ignore_index is 0/0 = nan
  (HF's ForCausalLMLoss calls exactly that);
- num_items: transformers' fixed_cross_entropy divides the summed loss by num_items_in_batch
  unguarded, so a step whose targets are all ignored (num_items_in_batch 0) is 0/0 = nan too.
DeepSpeed clamps both denominators to at least 1 (sequence/cross_entropy.py:273
`loss_sum / valid_tokens.clamp_min(1)` and :424 `loss / denominator.clamp_min(1)`), so it returns 0.
The gradient is zero either way; only the loss a user logs or tests differs. A deliberate choice
upstream (an intended difference, kept visible as a known divergence, not a bug): a user who
detects empty batches by a nan loss, or averages logged losses, sees different numbers.

Run (CPU, one process on a single-rank gloo group, a few seconds):
python ci/repro/deepspeed_ce_all_ignored_is_zero.py
Exit status 1 while DeepSpeed returns a number where torch returns nan, 0 once they agree.

Finding: findings/deepspeed_ce_all_ignored_is_zero.toml
"""
import importlib
import math
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import free_port, init_gloo, set_rank_env  # noqa: E402
import torch.nn.functional as F

VOCAB, TOKENS = 10, 6

if __name__ == "__main__":
    os.environ["DS_ACCELERATOR"] = "cpu"
    set_rank_env(0, 1, free_port())
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    from deepspeed.sequence.cross_entropy import VocabParallelCausalLMLoss, vocab_parallel_cross_entropy

    init_gloo()
    deepspeed.init_distributed(dist_backend="gloo")

    logits = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(0))
    ignored = torch.full((TOKENS,), -100)
    plain_mean = float(F.cross_entropy(logits, ignored, reduction="mean"))
    plain_items = float(F.cross_entropy(logits, ignored, reduction="sum") / torch.tensor(0))  # HF, num_items 0
    ds_mean = float(vocab_parallel_cross_entropy(logits, ignored, tp_group=dist.group.WORLD, reduction="mean"))
    # The causal loss shifts: logits [1, T+1, V] predict labels[:, 1:], every one of them ignored.
    causal_logits = torch.randn(1, TOKENS + 1, VOCAB, generator=torch.Generator().manual_seed(1))
    ds_items = float(VocabParallelCausalLMLoss(tp_group=dist.group.WORLD)(
        logits=causal_logits, labels=torch.full((1, TOKENS + 1), -100), vocab_size=VOCAB, num_items_in_batch=0))
    print(f"all targets ignored, mean:      torch F.cross_entropy {plain_mean}, "
          f"DeepSpeed vocab_parallel_cross_entropy {ds_mean}")
    print(f"all targets ignored, num_items: HF fixed_cross_entropy {plain_items}, "
          f"DeepSpeed VocabParallelCausalLMLoss {ds_items}")
    dist.destroy_process_group()
    differs = [name for name, want, got in (("mean", plain_mean, ds_mean), ("num_items", plain_items, ds_items))
               if math.isnan(want) != math.isnan(got)]
    print(f"DIFFERS ({', '.join(differs)}): DeepSpeed returns a number where torch returns nan" if differs
          else "DeepSpeed agrees with torch")
    sys.exit(1 if differs else 0)
