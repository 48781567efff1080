"""megatron-core 0.16.1: a mean loss over a micro-batch whose tokens are all masked is 0, torch's is nan.

An intended difference of conventions, not a bug. Megatron's pipeline schedule
(``megatron/core/pipeline_parallel/schedules.py``: ``output_tensor /= torch.clamp(num_tokens, min=1)``) divides the summed masked loss by
``torch.clamp(num_tokens, min=1)``, so an all-masked micro-batch contributes loss 0. A user without
tensor parallelism calls ``F.cross_entropy(reduction="mean")`` (HF's ForCausalLMLoss does), which
returns 0/0 = nan for it. The gradient is zero either way; only the loss value differs.

This script shows both sides: Megatron's vocab_parallel_cross_entropy reduced as pretrain_gpt's
loss_func and the schedule do (the clamp is read from the installed schedule's source, so the script
notices if Megatron drops it), against torch's mean.

Run (CPU, gloo, TP=2, about 20 s):  python ci/repro/megatron_all_masked_mean_is_zero.py
Exit status 1 while the two differ, 0 once they agree.

Finding: findings/megatron_all_masked_mean_is_zero.toml
"""
import inspect
import math
import os
import sys
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, TOKENS = 2, 8, 6


def rank_main(rank, result):
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP, create_gloo_process_groups=False)
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(TOKENS, 1, VOCAB, generator=gen)
    target = torch.randint(0, VOCAB, (TOKENS, 1), generator=gen)
    mask = torch.zeros(TOKENS, 1)  # every token masked (padding, or a prompt-only sample)
    width = VOCAB // TP
    logits = full[..., rank * width:(rank + 1) * width].clone()
    losses = vocab_parallel_cross_entropy(logits, target)
    clamps = "clamp(num_tokens, min=1)" in inspect.getsource(schedules)
    num_tokens = mask.sum()
    result[rank] = (float((losses * mask).sum() / (num_tokens.clamp(min=1) if clamps else num_tokens)), clamps)
    if rank == 0:
        ignored = torch.full((TOKENS,), -100)
        result["torch"] = float(F.cross_entropy(full.view(TOKENS, VOCAB), ignored, reduction="mean"))
    parallel_state.destroy_model_parallel()


def main() -> int:
    result = run_ranks(rank_main, TP)
    reference = result["torch"]
    differ = False
    for rank in range(TP):
        loss, clamps = result[rank]
        print(f"rank {rank}: Megatron mean over an all-masked micro-batch = {loss} "
              f"(schedule clamps num_tokens: {clamps}); torch F.cross_entropy mean = {reference}")
        differ |= not (math.isnan(loss) and math.isnan(reference)) and loss != reference
    print("Megatron and torch differ on an all-masked mean" if differ else "Megatron and torch agree")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
