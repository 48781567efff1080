"""DeepSpeed 0.19.8: with tensor_parallel.tp_overlap_comm, a column layer's empty shard fails its backward.

``tp_overlap_comm: true`` makes every AutoTP column layer run ``AsyncColumnParallel`` (module_inject/layers.py),
whose backward flattens the output gradient with ``grad_output.view(-1, grad_output.shape[-1])``. AutoTP accepts
a split that leaves a TP rank an empty shard of a column layer: here a gathered column ``lm_head`` over a
vocabulary of 2 at ``tp_grain_size`` 2 over tp 2, rows [2, 0]. The forward runs on both ranks (TP rank 1's
local logits are ``[batch, seq, 0]``, gathered to the whole vocabulary), but TP rank 1's backward gets a
``[batch, seq, 0]`` gradient, and ``view(-1, 0)`` of zero elements is ambiguous: ``RuntimeError: cannot
reshape tensor of 0 elements into shape [-1, 0] because the unspecified dimension size -1 can be any value and
is ambiguous``, raised after its input-gradient all-reduce was started asynchronously; TP rank 0 is left in a
collective. Without the switch (``--no-overlap``) ColumnParallel's backward has no such view: both ranks take
the step and the loss is plain torch's, which trains the whole model on one rank. ``.reshape`` or
``.flatten(0, -2)`` would not be ambiguous. Found by parity explore --budget 1800 (seed 1, 78118a0) on
column_gathered, shrunk to vocabulary 2, hidden 2, grain 2, fp32, ZeRO 0; the same at vocabulary 8 over tp 4
at grain 5 (shards [5, 3, 0, 0]), and under bf16 and ZeRO 2.

Run (CPU, about 6 s):
  python ci/repro/deepspeed_overlap_comm_empty_head_shard.py               # tp_overlap_comm: RuntimeError on TP rank 1
  python ci/repro/deepspeed_overlap_comm_empty_head_shard.py --no-overlap  # the plain column path: plain torch's loss
Exit status 1 while a rank fails or the loss differs from plain torch's, 0 otherwise.

Finding: findings/deepspeed_autotp_empty_shard_crashes.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN, GRAIN = 2, 2, 2, 2
OVERLAP = "--no-overlap" not in sys.argv


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.embed_tokens(ids)))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def batch():
    return torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))


def plain_loss() -> float:
    torch.manual_seed(0)
    with torch.no_grad():
        return Tiny()(batch()).item()


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "tp_overlap_comm": OVERLAP, "tp": {"tp_grain_size": GRAIN},
                                  "partition_config": {"use_default_specs": False, "layer_specs": [
                                      {"patterns": [r"lm_head\.weight$"], "partition_type": "column",
                                       "gather_output": True}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    shard = tuple(engine.module.lm_head.weight.shape)
    loss = engine(batch())
    try:
        engine.backward(loss)
        engine.step()
    except RuntimeError as exc:
        result[rank] = (f"lm_head shard {shard}, loss {float(loss.detach()):.6f}; backward raised RuntimeError: "
                        f"{str(exc).splitlines()[0][:110]}")
        return
    result[rank] = f"lm_head shard {shard}, loss {float(loss.detach()):.6f}, step taken"


if __name__ == "__main__":
    try:
        result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, timeout=90)
    except Exception as exc:  # a rank left in a collective by its peer's error
        print(f"ranks did not finish: {type(exc).__name__}: {str(exc)[-600:]}")
        sys.exit(1)
    expected = plain_loss()
    for rank in range(TP):
        print(f"rank {rank}: {result.get(rank)}")
    print(f"plain torch, one rank, the whole model: loss {expected:.6f}")
    failed = len(result) < TP or any("raised" in str(r) for r in result.values())
    wrong = not failed and any(f"loss {expected:.6f}," not in str(r) for r in result.values())
    mode = "tp_overlap_comm" if OVERLAP else "without tp_overlap_comm"
    print(f"{mode}: " + ("a rank failed" if failed else "a loss differs from plain torch's" if wrong
                         else "every rank took its step at plain torch's loss"))
    sys.exit(1 if failed or wrong else 0)
