"""DeepSpeed 0.19.8: `torch_autocast` with float16 skips other steps than torch's AMP loop, per rank with TP.

With {"torch_autocast": {"enabled": true, "dtype": "float16"}} DeepSpeed builds a plain torch.amp.GradScaler at its
defaults (2**16, backoff 0.5, growth every 2000 steps): the engine's without ZeRO (engine.py:672), the ZeRO
optimizer's otherwise (stage_1_and_2.py:612, stage3.py:473). A user's fp16 AMP loop without TP uses the same
scaler; torch's rule: a step with an inf/nan gradient is skipped and the scale halved.

- ZeRO 0 with tensor parallelism: GradScaler.step/unscale_ (engine.py:3512) look for inf/nan in the gradients
  THIS rank holds. A TP rank's head gradient is its own shard, and nothing all-reduces the found-inf flag over
  the TP group (torch's ShardedGradScaler does that for FSDP; DeepSpeed's own fp16 optimizers all-reduce their
  overflow flag). An overflow in one rank's shard makes that rank skip the step and halve its scale while its
  peer applies the step at the old scale: the replicated parameters part, and later steps scale the two ranks'
  gradients by different factors.
- ZeRO 1/2/3: the ZeRO optimizer checks overflow itself (over the DP and TP groups) and skips the step before its
  GradScaler sees it (stage_1_and_2.py step: check_overflow, then _update_scale of its own static scaler), so the
  GradScaler never backs off: the scale stays 2**16 and every step that overflows there is skipped, where torch's
  loop halves once and trains on.
Nothing is logged in either case.

The model: a tiny LM (embedding, replicated proj, column-parallel gathered lm_head without bias) in fp32, every
target the last vocabulary id (TP rank 1's shard), its loss a sum scaled so that lm_head's gradient overflows
fp16 at 2**16 and not at 2**15 (calibrated on the plain-torch model first).

Run (CPU, 2 processes over gloo, about 40 s):  python ci/repro/deepspeed_torch_autocast_fp16_grad_scaler.py
With --dp 2 (4 processes): two data-parallel replicas of each TP rank, fed the same batch (so DDP's average is the
one-process gradient): the engine's gradient all-reduce carries an inf to both replicas of a TP rank, so they agree
with each other, and the TP ranks part as at dp 1; ZeRO 1/2 skip alike on every rank.
Exit status 1 while a DeepSpeed run skips other steps than plain torch's AMP loop (or its ranks disagree).

Finding: findings/deepspeed_torch_autocast_fp16_grad_scaler.toml
"""
import argparse
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN, TOKENS, STEPS, LR = 2, 34, 32, 8, 4, 0.05
HEAD = {"partition_config": {"use_default_specs": False, "layer_specs": [
    {"patterns": [r"proj\.weight$"], "partition_type": "skip"},
    {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


IDS = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(1))
TARGETS = torch.full((TOKENS,), VOCAB - 1)


def loss_of(logits, factor):
    return factor * nn.functional.cross_entropy(logits.float().view(-1, VOCAB), TARGETS, reduction="sum")


def calibrated_factor() -> float:
    """The loss factor at which lm_head's largest gradient times 2**16 is 1.4x fp16's largest value."""
    model = Tiny()
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(IDS)
    loss_of(logits, 1.0).backward()
    return 1.4 * 65504.0 / (2.0 ** 16 * float(model.lm_head.weight.grad.abs().max()))


def plain_amp(factor):
    """The user's fp16 AMP loop without TP: the skipped steps."""
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu")
    skipped = []
    for step in range(STEPS):
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(IDS)
        scaler.scale(loss_of(logits, factor)).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if scaler.get_scale() < before:
            skipped.append(step)
    return skipped


def engine_run(zero, factor):
    import deepspeed

    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": zero}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "torch_autocast": {"enabled": True, "dtype": "float16"}, "tensor_parallel": {"autotp_size": TP, **HEAD}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=LR), config=config)
    scaler = engine.torch_autocast_z0_gradscaler or engine.optimizer.torch_autocast_gradscaler
    skipped, scales = [], []
    for step in range(STEPS):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        scales.append(scaler.get_scale())
        engine.backward(loss_of(engine(IDS), factor))
        engine.step()
        if all(torch.equal(before[n], p) for n, p in model.named_parameters()):
            skipped.append(step)
    proj = model.proj.weight.detach().clone()
    engine.destroy()
    return {"skipped": skipped, "scales": scales, "proj": proj}


def rank_main(rank, result, factor):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result[rank] = {zero: engine_run(zero, factor) for zero in (0, 1)}


if __name__ == "__main__":
    factor = calibrated_factor()
    torch_skipped = plain_amp(factor)
    print(f"plain torch fp16 AMP (GradScaler, no TP): skips steps {torch_skipped} of {STEPS}")
    parser = argparse.ArgumentParser()
    parser.add_argument("--dp", type=int, default=1, help="data-parallel replicas of each TP rank (world TP x dp)")
    dp = parser.parse_args().dp
    result = run_ranks(rank_main, TP * dp, factor, env={"DS_ACCELERATOR": "cpu"}, init=False)
    wrong = False
    for zero in (0, 1):
        # AutoTP's TP groups are consecutive ranks: rank r is TP rank r % TP of replica r // TP.
        runs = [result[rank][zero] for rank in range(TP * dp)]
        for rank, run in enumerate(runs):
            print(f"DeepSpeed torch_autocast fp16, ZeRO {zero}, TP rank {rank % TP} of replica {rank // TP}: skips "
                  f"steps {run['skipped']}, GradScaler scale per step {run['scales']}")
            wrong |= run["skipped"] != torch_skipped
        parted = float((runs[0]["proj"] - runs[1]["proj"]).abs().max())
        print(f"  replicated proj.weight, TP rank 0 vs 1: max difference {parted:.3e}")
        for replica in range(1, dp):
            apart = float((runs[0]["proj"] - runs[replica * TP]["proj"]).abs().max())
            print(f"  replicated proj.weight, replica 0 vs {replica} (TP rank 0): max difference {apart:.3e}")
            wrong |= apart > 0
        wrong |= parted > 0
    print("DIFFERENT: DeepSpeed's fp16 autocast skips other steps than torch's AMP loop" if wrong else "same steps")
    sys.exit(1 if wrong else 0)
