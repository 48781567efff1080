"""DeepSpeed 0.19.8: the Liger-or-torch CE gate is decided on each rank alone, and ranks disagree.

A user sets `vocab_parallel_ce_backend: "liger"` with `tp_grain_size: 4` and TP 3 on a vocabulary of 18
(on CUDA). AutoTP shards the head 8/4/6. `_liger_can_run` (sequence/cross_entropy.py:47-58) asks
"local_vocab_size * tp_world == global_vocab_size" per rank: 6 * 3 == 18 holds on rank 2 only, so rank 2
runs Liger's kernel while ranks 0 and 1 run the torch CE. Both issue three all-reduces of the same
shapes in a different order, so nothing hangs: plain PyTorch (F.cross_entropy on the full logits) gives
the true per-token loss, DeepSpeed gives wrong losses on ranks 0/1 and NaN on rank 2, without a word.
Liger's fallback is meant to be taken by every rank alike whenever the shards are uneven.

On CPU the accelerator reports no Triton, so the gate never picks Liger: this script patches
`is_triton_supported` / `on_accelerator` to what a CUDA accelerator reports and runs Liger in
Triton's interpreter (TRITON_INTERPRET=1). On a GPU the same call needs no patch.

Run (CPU, about 15 s):  python ci/repro/deepspeed_liger_gate_per_rank.py
Exit status 1 while the ranks decide differently or the loss is wrong, 0 once every rank agrees and
the loss matches F.cross_entropy.

Finding: findings/deepspeed_liger_gate_per_rank.toml
"""
import importlib
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Liger's kernels are defined

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, GRAIN, TOKENS = 3, 18, 4, 6


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import deepspeed.sequence.cross_entropy as ce
    from deepspeed.accelerator import get_accelerator
    from deepspeed.module_inject.tp_shard import AutoTPMeta, get_shard_size_list

    deepspeed.init_distributed(dist_backend="gloo")
    accelerator = get_accelerator()
    accelerator.is_triton_supported = lambda: True  # what a CUDA accelerator reports
    accelerator.on_accelerator = lambda tensor: True
    # The layout AutoTP gives the head for this config (tp_shard.py's grain branch).
    sizes = get_shard_size_list(VOCAB, TP, AutoTPMeta(tp_grain_size=GRAIN), "lm_head")
    start = sum(sizes[:rank])
    end = start + sizes[rank]
    logits = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(0))
    target = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(1))
    group = dist.group.WORLD
    chose_liger = ce._liger_can_run(logits[:, start:end], target, sizes[rank], VOCAB, group)
    loss = ce.vocab_parallel_cross_entropy(logits[:, start:end].contiguous(), target, tp_group=group,
                                           vocab_start_index=start, vocab_end_index=end, reduction="none",
                                           backend="liger")
    want = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    result[rank] = (sizes, chose_liger, float((loss - want).abs().max()), loss[:3].tolist(), want[:3].tolist())


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu", "TRITON_INTERPRET": "1"})
    for rank in range(TP):
        sizes, liger, err, got, want = result[rank]
        print(f"rank {rank}: shards {sizes}, gate picks {'liger' if liger else 'torch'}, "
              f"max |loss - F.cross_entropy| = {err:.3g}, loss[:3] = {[round(x, 3) for x in got]} "
              f"(F.cross_entropy: {[round(x, 3) for x in want]})")
    decisions = {result[r][1] for r in range(TP)}
    wrong = len(decisions) > 1 or not all(result[r][2] <= 1e-4 for r in range(TP))  # NaN fails too
    print("WRONG: the ranks took different CE backends" if len(decisions) > 1 else
          ("WRONG: loss differs from F.cross_entropy" if wrong else "every rank agrees and the loss matches"))
    sys.exit(1 if wrong else 0)
