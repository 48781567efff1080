"""DeepSpeed 0.19.8: VocabParallelCausalLMLoss silently drops an `ignore_index` passed by the model.

With `vocab_parallel_lm_head: true` the engine installs `VocabParallelCausalLMLoss` as
`model.loss_function`. A Hugging Face model forwards its loss keyword arguments, and a user whose
padding labels are the pad id (here 0) calls `model(input_ids, labels=labels, ignore_index=0)`;
HF's `ForCausalLMLoss` honours `ignore_index`, so plain PyTorch skips the pad targets.
`VocabParallelCausalLMLoss.__call__(..., **kwargs)` (sequence/cross_entropy.py:400) swallows it and
uses the `ignore_index` fixed at construction (-100; the engine offers no way to set another), so the
pads are counted as targets: a different loss and different gradients, with no warning.

Run (CPU, one process on a single-rank gloo group, a few seconds):
python ci/repro/deepspeed_causal_lm_loss_ignore_index.py
Exit status 1 while the keyword is ignored, 0 once the loss honours it (or rejects it).

Finding: findings/deepspeed_causal_lm_loss_ignore_index.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import free_port, init_gloo, set_rank_env  # noqa: E402

VOCAB, PAD = 10, 0

if __name__ == "__main__":
    os.environ["DS_ACCELERATOR"] = "cpu"
    set_rank_env(0, 1, free_port())
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    from deepspeed.sequence.cross_entropy import VocabParallelCausalLMLoss

    init_gloo()
    deepspeed.init_distributed(dist_backend="gloo")

    logits = torch.randn(2, 6, VOCAB, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[3, 4, 5, PAD, PAD, PAD], [1, 2, 7, 8, PAD, PAD]])

    def plain(ignore_index):  # transformers' ForCausalLMLoss, mean reduction: shift, then F.cross_entropy
        return float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                                                       ignore_index=ignore_index))

    try:
        ds = float(VocabParallelCausalLMLoss(tp_group=dist.group.WORLD)(logits=logits, labels=labels,
                                                                        vocab_size=VOCAB, ignore_index=PAD))
        outcome = f"{ds:.6f}"
    except (TypeError, ValueError) as exc:  # rejecting the keyword would be a fix too
        ds, outcome = None, f"raised {type(exc).__name__}: {exc}"
    print(f"plain PyTorch / HF, ignore_index={PAD}:     {plain(PAD):.6f}")
    print(f"the same with the pads counted as targets:  {plain(-100):.6f}")
    print(f"VocabParallelCausalLMLoss(..., ignore_index={PAD}): {outcome}")
    dist.destroy_process_group()
    wrong = ds is not None and abs(ds - plain(PAD)) > 1e-5
    print("WRONG: ignore_index was dropped" if wrong else "ignore_index honoured (or refused)")
    sys.exit(1 if wrong else 0)
