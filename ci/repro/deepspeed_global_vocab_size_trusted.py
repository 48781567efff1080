"""DeepSpeed 0.19.8: vocab_parallel_cross_entropy trusts a caller's global_vocab_size, and a wrong one gives
silently wrong numbers.

`global_vocab_size` lets a caller skip the collective shard-layout validation; it "is trusted as-is"
(sequence/cross_entropy.py:236-241). It feeds two decisions, and nothing checks it against the shards:
1. The Liger gate (`_liger_can_run`, :47-58) asks `local_vocab_size * tp_world == global_vocab_size` on each
   rank alone. Vocabulary 35 over TP 2 is sharded 18/17 (uneven: torch's CE should run on both); a
   global_vocab_size of 36 (one too many) passes the test on rank 0 (18 * 2) and fails it on rank 1 (17 * 2).
   Rank 0 runs Liger's kernel, rank 1 the torch CE: their three all-reduces have the same shapes in a different
   order (Liger: max, target logit, sum of exp; torch: max, sum of exp, target logit), so nothing hangs and both
   ranks return wrong per-token losses, without a word. On equal shards a too-large value only sends the call to
   torch (numbers right, a warning that blames the shards).
2. The target range check (:244-246) compares targets with it: with one too many, a target equal to the
   vocabulary size (which belongs to no shard) is accepted and gets a finite loss; unset, DeepSpeed raises
   ValueError("Target is out of range ..."), as torch's cross_entropy raises. One too few refuses any target at
   the last id (a ValueError naming the wrong size), and with the torch backend nothing else reads it.

On CPU the accelerator reports no Triton, so the gate never picks Liger: as
ci/repro/deepspeed_liger_gate_per_rank.py does, this script patches `is_triton_supported` / `on_accelerator` to
what a CUDA accelerator reports and runs Liger in Triton's interpreter (TRITON_INTERPRET=1). On a GPU the same
calls need no patch.

Run (CPU, 2 ranks, about 20 s):  python ci/repro/deepspeed_global_vocab_size_trusted.py
Exit status 1 while a wrong global_vocab_size gives a wrong loss or accepts an out-of-range target, 0 once
DeepSpeed refuses the wrong value (or computes the right numbers anyway).

Finding: findings/deepspeed_global_vocab_size_trusted.toml
"""
import importlib
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Liger's kernels are defined

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, TOKENS = 2, 8


def inputs(vocab):
    logits = 3 * torch.randn(TOKENS, vocab, generator=torch.Generator().manual_seed(0))
    target = torch.randint(0, vocab, (TOKENS,), generator=torch.Generator().manual_seed(1))
    return logits, target


def call(rank, vocab, global_vocab_size, backend, out_of_range=False):
    """(backend that ran, max |loss - F.cross_entropy|, loss[:3]) or the error DeepSpeed raised."""
    import deepspeed.sequence.cross_entropy as ce

    logits, target = inputs(vocab)
    want = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    if out_of_range:
        target[2] = vocab  # one past the last id: no shard owns it
    local = -(-vocab // TP)  # AutoTP's near-even split for TP 2: ceil, then the remainder
    start, end = rank * local, min((rank + 1) * local, vocab)
    ran = []
    torch_fn, liger_fn = ce._VocabParallelCrossEntropy, ce._liger_vocab_cross_entropy

    class Recorded:
        @staticmethod
        def apply(*args):
            ran.append("torch")
            return torch_fn.apply(*args)

    def liger_recorded(*args):
        ran.append("liger")
        return liger_fn(*args)

    ce._VocabParallelCrossEntropy, ce._liger_vocab_cross_entropy = Recorded, liger_recorded
    try:
        loss = ce.vocab_parallel_cross_entropy(logits[:, start:end].contiguous(), target, tp_group=dist.group.WORLD,
                                               vocab_start_index=start, vocab_end_index=end,
                                               global_vocab_size=global_vocab_size, reduction="none", backend=backend)
    except ValueError as exc:
        return f"raised ValueError: {exc}"
    finally:
        ce._VocabParallelCrossEntropy, ce._liger_vocab_cross_entropy = torch_fn, liger_fn
    if out_of_range:
        return f"ran {ran[0]}, no error; loss of the out-of-range token = {float(loss[2]):.4f}"
    err = float((loss - want).abs().max())
    return f"ran {ran[0]}, max |loss - F.cross_entropy| = {err:.4g}, loss[:3] = {[round(x, 3) for x in loss[:3].tolist()]}"


SCENARIOS = [  # (label, vocab, global_vocab_size, backend, out_of_range)
    ("liger, vocab 35 (shards 18/17), global_vocab_size 35 (right)", 35, 35, "liger", False),
    ("liger, vocab 35 (shards 18/17), global_vocab_size 36 (one too many)", 35, 36, "liger", False),
    ("liger, vocab 32 (shards 16/16), global_vocab_size 33 (one too many)", 32, 33, "liger", False),
    ("torch, vocab 32, global_vocab_size 31 (one too few)", 32, 31, "torch", False),
    ("torch, vocab 32, global_vocab_size unset, a target = 32", 32, None, "torch", True),
    ("torch, vocab 32, global_vocab_size 33 (one too many), a target = 32", 32, 33, "torch", True),
]


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed(dist_backend="gloo")
    accelerator = get_accelerator()
    accelerator.is_triton_supported = lambda: True  # what a CUDA accelerator reports
    accelerator.on_accelerator = lambda tensor: True
    for label, vocab, size, backend, oob in SCENARIOS:
        result[(rank, label)] = call(rank, vocab, size, backend, oob)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu", "TRITON_INTERPRET": "1"})
    logits, target = inputs(35)
    print(f"F.cross_entropy, vocab 35: loss[:3] = "
          f"{[round(x, 3) for x in torch.nn.functional.cross_entropy(logits, target, reduction='none')[:3].tolist()]}")
    wrong = False
    for label, vocab, size, backend, oob in SCENARIOS:
        print(label)
        for rank in range(TP):
            outcome = result[(rank, label)]
            print(f"  rank {rank}: {outcome}")
            if size is not None and size > vocab:
                bad_loss = "max |loss" in outcome and not float(outcome.split("= ")[1].split(",")[0]) <= 1e-4
                wrong |= bad_loss or (oob and "no error" in outcome)  # NaN counts as a bad loss
    print("WRONG: a too-large global_vocab_size gives wrong losses or accepts an out-of-range target" if wrong
          else "every wrong global_vocab_size is refused or harmless")
    sys.exit(1 if wrong else 0)
