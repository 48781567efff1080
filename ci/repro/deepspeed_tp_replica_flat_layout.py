"""DeepSpeed 0.19.8, ZeRO 1/2 with AutoTP: with uneven head shards the TP ranks' copies of a TP-replicated parameter
drift apart, by two roundings that read each TP rank's own flat ZeRO layout.

AutoTP splits an odd vocabulary unevenly (3 rows over tp 2: 2/1), so the flat buffer ZeRO 1/2 builds on each TP rank
has another length (embedding, proj, proj.bias, then the head's shard) and the data-parallel partitions another
boundary: proj.weight, replicated on both TP ranks, sits at other offsets of other partitions. Nothing afterwards
makes the replicas agree again (no TP broadcast or check), so any rounding that depends on the place differs:

1. bf16_master_weights_and_grads (+ bf16_optimizer_states), tp 2 x dp 2, ZeRO 1: both TP ranks hand the optimizer
   bitwise the same proj.weight gradient, and still step it to different bf16 weights. The step is
   torch.optim.SGD's p.add_(g, alpha=-lr) on the flat bf16 partition, and torch's CPU kernel rounds an element by its
   place in that tensor: the vectorised body computes w + alpha * g in float32 and rounds once, the scalar tail (the
   last numel % 32 elements on this AVX-512 machine) rounds alpha * g to bf16 first. Partitions of 38 and 34
   elements put proj.weight[16:20] in the tail on TP rank 0 and in the body on TP rank 1. dp 2's sum is
   commutative; it is the update that differs. dp 1 too where the two flat lengths straddle a multiple of 32
   (vocab 3, hidden 10: 162 and 152 elements), rarely (4 of 1197 uneven points at vocab < 40, hidden <= 64). An even vocabulary (4: 2/2) gives equal layouts: the
   replicas stay bitwise equal.
2. float32, tp 2 x dp 3, ZeRO 1, vocab 35 (18/17): each TP rank's data-parallel group sums proj.weight's gradient
   over other partition boundaries, in another order: the replicas' gradients differ by an ulp at the first step
   (ci/repro/deepspeed_universal_replicated_state_differs.py follows it into the optimizer state and a checkpoint
   that ds_to_universal refuses).

Plain PyTorch keeps a replicated parameter one value on every rank that holds it.

Run (CPU, 4, 4, 2 then 6 processes over gloo, about 2 minutes):  python ci/repro/deepspeed_tp_replica_flat_layout.py
Exit status 1 while the uneven runs' replicas differ (or an even run's do), 0 once they agree.

Finding: findings/deepspeed_tp_replica_drift.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, LR = 2, 0.05


class Tiny(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.lm_head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())


def rank_main(rank, result, vocab, hidden, bf16_master, steps):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny(vocab, hidden)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"proj\.weight$"], "partition_type": "skip"},
                  {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}}}
    if bf16_master:
        model = model.bfloat16()
        config["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=LR), config=config)
    data = torch.Generator().manual_seed(1 + rank // TP)  # each data-parallel replica its own batches
    p, bias, seen = model.proj.weight, model.proj.bias, []
    for _ in range(steps):
        engine.backward(engine(torch.randint(0, vocab, (2, 5), generator=data)))
        grad = safe_get_full_grad(p).float().clone()  # the reduced gradient the step applies (exact in float32)
        engine.step()
        seen.append((grad, p.detach().float().clone(), bias.detach().float().clone()))
    result[rank] = seen
    engine.destroy()


def replicas_differ(label, vocab, hidden, dp, bf16_master, steps):
    """Runs tp 2 x dp and compares TP rank 1 with TP rank 0 of data-parallel replica 0: True where they differ."""
    seen = run_ranks(rank_main, TP * dp, vocab, hidden, bf16_master, steps, env={"DS_ACCELERATOR": "cpu"}, init=False)
    differ = False
    for step, ((g0, w0, b0), (g1, w1, b1)) in enumerate(zip(seen[0], seen[1])):
        grads, weights, biases = int((g0 != g1).sum()), int((w0 != w1).sum()), int((b0 != b1).sum())
        print(f"{label} step {step}: proj.weight gradient differs in {grads}, weight after the step in {weights} "
              f"of {w0.numel()} entries; proj.bias after the step in {biases} of {b0.numel()}")
        differ |= grads > 0 or weights > 0 or biases > 0
    return differ


if __name__ == "__main__":
    uneven = replicas_differ("bf16 masters, vocab 3 (2/1), tp 2 x dp 2:", 3, 6, 2, True, 5)
    even = replicas_differ("bf16 masters, vocab 4 (2/2), tp 2 x dp 2:", 4, 6, 2, True, 5)
    # dp 1: each TP rank's partition is its whole buffer (162 and 152 elements), proj.weight's last 2 entries and
    # proj.bias in TP rank 1's scalar tail only; a rounding that tells the two paths apart takes some steps to meet.
    alone = replicas_differ("bf16 masters, vocab 3 (2/1), hidden 10, tp 2 x dp 1:", 3, 10, 1, True, 20)
    summed = replicas_differ("float32, vocab 35 (18/17), tp 2 x dp 3:", 35, 8, 3, False, 1)
    wrong = uneven or alone or summed or even
    print("MISMATCH: a TP-replicated parameter differs between TP ranks" if wrong else "replicas agree")
    sys.exit(1 if wrong else 0)
