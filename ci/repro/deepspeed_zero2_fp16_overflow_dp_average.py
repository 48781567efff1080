"""DeepSpeed 0.19.8: with fp16 and data parallelism, ZeRO 2 checks overflow on the replicas' average.

ZeRO 2 reduce-scatters each micro-batch's gradient as soon as its backward ends, dividing by the data-parallel
size first (stage_1_and_2.py average_tensor), and accumulates the averaged fp16 partitions. Its overflow check
(has_overflow) then sees the sum over micro-batches of the replicas' average. Plain torch (DDP accumulating
locally under no_sync, then one all-reduce, as the HF Trainer does) and ZeRO 1 accumulate each replica's own
micro-batches in its fp16 .grad first: a replica whose accumulated gradient exceeds fp16's range makes inf, and
GradScaler (ZeRO 1 alike) skips the step. So ZeRO 2 applies steps plain torch and ZeRO 1 skip, whenever one
replica's accumulated gradient overflows and the average does not. The step it applies is finite; the loss-scale
schedule (and every later skip) then differs from torch's.

Here: one weight, two replicas, two micro-batches, dynamic loss scale 2. Replica 0's scaled gradient is 40000 per
micro-batch (80000 accumulated: inf in fp16), replica 1's 1000: the per-micro-batch average 20500, 41000 accumulated.
(The suite's case, cases/deepspeed_loss_scale.toml dp 2: the replicas' step-0 maxima 2**0.52 over fp16's range, their
average 2**-0.09 under it.)

Run (CPU with oneDNN fp16; two processes on a gloo group, about 20 s):
python ci/repro/deepspeed_zero2_fp16_overflow_dp_average.py
Exit status 1 while ZeRO 2 applies the step ZeRO 1 skips, 0 once they agree; 2 where this CPU has no oneDNN fp16.

Finding: findings/deepspeed_zero2_fp16_overflow_dp_average.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

# Each replica's input, which is its weight's gradient per micro-batch as the engine holds it: engine.backward divides
# the loss by the 2 accumulation steps and multiplies it by the loss scale of 2.
PER_MICRO = {0: 40000.0, 1: 1000.0}


def skipped(deepspeed, stage: int, rank: int) -> tuple:
    model = torch.nn.Linear(1, 1, bias=False).to(torch.float16)
    with torch.no_grad():
        model.weight.fill_(1.0)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
           "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 1}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=1e-6), config=cfg)
    x = torch.full((1, 1), PER_MICRO[rank], dtype=torch.float16)
    for _ in range(2):
        engine.backward(engine(x).float().sum())
        engine.step()
    found = (int(engine.skipped_steps), float(engine.optimizer.loss_scale))
    engine.destroy()
    return found


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result[rank] = {stage: skipped(deepspeed, stage, rank) for stage in (1, 2)}


if __name__ == "__main__":
    try:
        fp16 = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # noqa: BLE001 - no way to ask: treat as missing
        fp16 = False
    if not fp16:
        print("this CPU has no oneDNN fp16: DeepSpeed's CPU accelerator refuses fp16 engines; run it on one that has")
        sys.exit(2)
    result = run_ranks(rank_main, 2, env={"DS_ACCELERATOR": "cpu"}, timeout=120)
    for stage in (1, 2):
        print(f"ZeRO {stage}: (skipped steps, loss scale after) per rank: {[result[r][stage] for r in (0, 1)]}")
    wrong = result[0][1][0] != result[0][2][0]
    print("WRONG: ZeRO 2 applied the step ZeRO 1 (and torch's GradScaler on a replica's inf) skipped" if wrong
          else "ZeRO 1 and ZeRO 2 skip alike")
    sys.exit(1 if wrong else 0)
