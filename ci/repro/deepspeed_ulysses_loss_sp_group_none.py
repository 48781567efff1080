"""DeepSpeed 0.19.8: under the Ulysses engine, the vocab-parallel loss with sp_group=None (as documented) gives the
gradient of the sum of the SP chunks' means, not of the sequence's token mean.

``VocabParallelCausalLMLoss`` and ``configure_vocab_parallel_loss`` say: leave ``sp_group`` None under DeepSpeed's
Ulysses sequence-parallel engine, "the engine aggregates the per-shard means itself, weighted by each shard's
valid-token count" (cross_entropy.py:345-349, 460-462). Nothing in the 0.19.8 engine or runtime/sequence_parallel
does: the engine all-reduces gradients over the sequence-data-parallel group divided by the DP size only
(engine.py:3884), i.e. sums them over the SP ranks. Each rank's loss is its chunk's mean, so the step's gradient is
that of the sum of the chunks' means: SP times a mean of means (here 1.72x torch's gradient norm), without a word.
With ``sp_group`` passed (what the docstring says not to do), each rank's loss is the sequence's mean with the
gradient of its own tokens' share, and the engine's sum is torch's gradient.

Setup: the Ulysses groups of DeepSpeed's own ``parallel_state_sp`` (the mpu the ALST / HF integration passes),
world 2 = SP 2, no TP (tp_group None: the loss on the full vocabulary), ZeRO 0, fp32, a linear head on a sequence of
8 hidden states, each rank its chunk of 4; chunk 0 has 2 ignored targets, chunk 1 none.

Plain PyTorch (what the user means): F.cross_entropy over the whole sequence (mean over its non-ignored targets).

Run (CPU, 2 gloo ranks, ~30 s): python ci/repro/deepspeed_ulysses_loss_sp_group_none.py
Exit status 1 while the documented sp_group=None gives a gradient other than torch's.

Finding: findings/deepspeed_ulysses_loss_sp_group_none.toml
"""
import importlib
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

SP, VOCAB, HIDDEN, TOKENS = 2, 10, 4, 8


def inputs():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen)
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    targets[[0, 1]] = -100
    return hidden, targets


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.sequence.cross_entropy import VocabParallelCausalLMLoss

    deepspeed.init_distributed(dist_backend="gloo")
    parallel_state_sp.initialize_sequence_parallel(SP)
    hidden, targets = inputs()
    rows = slice(rank * TOKENS // SP, (rank + 1) * TOKENS // SP)
    torch.manual_seed(0)
    plain = nn.Linear(HIDDEN, VOCAB)
    F.cross_entropy(plain(hidden), targets).backward()
    out = {}
    for label, sp_group in (("sp_group=None (documented)", None),
                            ("sp_group=SP group", parallel_state_sp.get_sequence_parallel_group())):
        head = nn.Linear(HIDDEN, VOCAB)
        head.load_state_dict(plain.state_dict())
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
                  "zero_optimization": {"stage": 0}}
        engine, *_ = deepspeed.initialize(model=head, optimizer=torch.optim.SGD(head.parameters(), lr=1.0),
                                          config=config, mpu=parallel_state_sp)
        loss_fn = VocabParallelCausalLMLoss(tp_group=None, sp_group=sp_group)
        loss = loss_fn(engine(hidden[rows]), shift_labels=targets[rows])
        engine.backward(loss)
        grad = engine.module.weight.grad
        out[label] = (engine.sequence_parallel_size, float(loss.detach()), float(grad.norm() / plain.weight.grad.norm()),
                      float((grad - plain.weight.grad).abs().max()))
        engine.destroy()
    result[rank] = out


if __name__ == "__main__":
    result = run_ranks(rank_main, SP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    hidden, targets = inputs()
    torch.manual_seed(0)
    plain = nn.Linear(HIDDEN, VOCAB)
    with torch.no_grad():
        print(f"torch: loss over the sequence {float(F.cross_entropy(plain(hidden), targets)):.6f}")
    wrong = False
    for rank in range(SP):
        for label, (sp, loss, ratio, err) in result[rank].items():
            print(f"rank {rank} (sequence_parallel_size {sp}) {label}: loss {loss:.6f}, "
                  f"|weight grad| / |torch's| = {ratio:.4f}, max |grad - torch's| = {err:.3g}")
            wrong |= label.startswith("sp_group=None") and err > 1e-5
    print("WRONG: the documented sp_group=None under the Ulysses engine is not torch's gradient" if wrong
          else "the documented sp_group=None gives torch's gradient")
    sys.exit(1 if wrong else 0)
