"""DeepSpeed 0.19.8: the BF16_Optimizer's first step fails on a TP rank whose row shard is empty.

With ``tp_grain_size`` larger than the hidden size over tp (hidden 8 over tp 2 with grain 8), AutoTP's row
split gives TP rank 0 all 8 hidden columns of the head and TP rank 1 none: a (vocab, 0) weight. Under
ZeRO 0-2 with their default optimizers DeepSpeed trains that to plain torch's numbers (cases/deepspeed_row_head.toml).
bf16 with ZeRO 1 and ``data_types.grad_accum_dtype`` "fp32" selects the BF16_Optimizer instead, and its step
(bf16_optimizer.py, step -> runtime/utils.py get_global_norm_of_tensors) stacks the norms of the rank's
gradients that count towards the global norm: TP rank 1's replicated parameters count only on TP rank 0
and its head shard is empty, so the list is empty and ``torch.stack`` raises
``RuntimeError: stack expects a non-empty TensorList`` after deepspeed.initialize converted the model and the
first backward ran; TP rank 0 is left in the norm's all-reduce until its peer's exit closes it. Plain torch
takes the step. Found by parity explore --budget 1800 (seed 0) on tied_row_parallel, shrunk to vocabulary 2,
hidden 2, grain 2; the untied row head fails the same way. So does the gathered column head with an empty
vocabulary shard (``--column``: vocabulary 3 over tp 4, a [0, 8] weight on TP rank 3, which ZeRO 0-2's default
optimizers train; only the vocabulary-parallel head refuses such a split).

Run (CPU, about 20 s):
  python ci/repro/deepspeed_bf16_optimizer_empty_row_shard.py          # ZeRO 1: RuntimeError on TP rank 1
  python ci/repro/deepspeed_bf16_optimizer_empty_row_shard.py --zero 2 # ZeRO 2, no BF16_Optimizer: a step on both
  python ci/repro/deepspeed_bf16_optimizer_empty_row_shard.py --column # the gathered column head: TP rank 3
Exit status 1 while a rank raises, 0 once every rank takes its step.

Finding: findings/deepspeed_autotp_empty_shard_crashes.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

COLUMN = "--column" in sys.argv
TP, VOCAB, HIDDEN, GRAIN = (4, 3, 8, 1) if COLUMN else (2, 2, 8, 8)
ZERO = int(sys.argv[sys.argv.index("--zero") + 1]) if "--zero" in sys.argv else 1
HEAD_SPEC = ({"partition_type": "column", "gather_output": True} if COLUMN else {"partition_type": "row"})


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.embed_tokens(ids)))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": ZERO},
              "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "tp": {"tp_grain_size": GRAIN}, "partition_config": {
                  "use_default_specs": False,
                  "layer_specs": [{"patterns": [r"lm_head\.weight$"], **HEAD_SPEC}]}}}
    engine, optimizer, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                 optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    label = f"{type(optimizer).__name__}, head shard {tuple(engine.module.lm_head.weight.shape)}"
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    try:
        loss = engine(ids)
        engine.backward(loss)
        engine.step()
        result[rank] = f"{label}: loss {float(loss.detach()):.6f}, step taken"
    except RuntimeError as exc:
        result[rank] = f"{label}: RuntimeError {str(exc).splitlines()[0][:110]}"


if __name__ == "__main__":
    try:
        result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, timeout=90)
    except Exception as exc:  # a rank left in the norm's all-reduce by its peer's error
        print(f"ranks did not finish: {type(exc).__name__}: {str(exc)[-600:]}")
        sys.exit(1)
    for rank in range(TP):
        print(f"rank {rank}: {result.get(rank)}")
    raised = any("RuntimeError" in str(r) for r in result.values())
    print(f"ZeRO {ZERO}, bf16, grad_accum fp32: " + ("a rank failed its first step" if raised else "every rank took its step"))
    sys.exit(1 if raised else 0)
