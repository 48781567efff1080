"""DeepSpeed 0.19.8: ZeRO 3 fails the first forward when AutoTP leaves a rank an empty row shard.

With ``tp_grain_size`` larger than the hidden size over tp (hidden 8 over tp 2 with grain 8), AutoTP's
row split (partition_type "row", a LinearAllreduce) gives TP rank 0 all 8 hidden columns and TP rank 1
none: a weight of shape (vocab, 0). DeepSpeed accepts it (ZeRO 0-2 then train to plain torch's numbers:
cases/deepspeed_row_head.toml), but under ZeRO 3 the partitioned-parameter coordinator asserts
``param.ds_status == ZeroParamStatus.AVAILABLE`` for that zero-element parameter
(runtime/zero/partitioned_param_coordinator.py, _fetch_sub_module_impl) in the first forward, after
deepspeed.initialize has converted the model; the other rank waits in a collective. Plain torch computes
the loss. Found by parity explore --budget 1800 (seed 0), shrunk to vocab 2, hidden 8, tp 2, grain 8.

A head with a bias takes another path through the same fetch: at tp 2 alone it trains to torch's
numbers (why that fetch succeeds was not traced), and with data parallelism beside it (tp 2 x dp 2) the all-gather
of the zero-element weight over the DP ranks raises ``ValueError: torch.cat(): expected a non-empty list
of Tensors`` (partition_parameters.py, wait); found by the next explore run at vocab 81, hidden 46,
grain 46, tp 2, dp 2. Without a bias it asserts at dp 2 as at dp 1.

Run (CPU, 20-35 s each):
  python ci/repro/deepspeed_zero3_empty_row_shard.py                  # AssertionError
  python ci/repro/deepspeed_zero3_empty_row_shard.py --bias --dp 2    # ValueError
  python ci/repro/deepspeed_zero3_empty_row_shard.py --bias           # both ranks return a loss
  python ci/repro/deepspeed_zero3_empty_row_shard.py --bias --bf16    # KeyError after one step
  python ci/repro/deepspeed_zero3_empty_row_shard.py --embedding      # AssertionError, on the embedding
  python ci/repro/deepspeed_zero3_empty_row_shard.py --column --bias  # AssertionError, the column head's [0, 8]
Exit status 1 while a rank raises one of them, 0 once every rank returns a loss.

A spec'd embedding (AutoTP slices its hidden dim for either partition_type) with an empty slice asserts
the same way (--embedding; found by parity explore --budget 1800 at vocab 133, hidden 57 over tp 4 with
grain 20, a column spec): the first module fetched is the embedding.

In bf16 the biased tp-2 head trains a step, but the float32 master of the empty shard cannot be read:
``deepspeed.utils.safe_get_full_fp32_param`` raises ``KeyError`` (stage3.py, _get_fp32_opt_state_partition:
ZeRO 3 keeps no grad_position for a zero-element parameter), where ZeRO 1 and 2 return None for it.

The gathered column head (``--column``: a column spec with gather_output, vocabulary 3 over tp 4) leaves TP rank 3 a
(0, hidden) weight and bias, which ZeRO 0-2 train; ZeRO 3 asserts on it as on the row shard, bias or not.

Finding: findings/deepspeed_autotp_empty_shard_crashes.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

COLUMN = "--column" in sys.argv  # the gathered column head with an empty vocabulary shard instead of the row head
TP, VOCAB, HIDDEN, GRAIN = (4, 3, 8, 1) if COLUMN else (2, 2, 8, 8)
DP = int(sys.argv[sys.argv.index("--dp") + 1]) if "--dp" in sys.argv else 1
BIAS = "--bias" in sys.argv
BF16 = "--bf16" in sys.argv
EMBEDDING = "--embedding" in sys.argv  # spec the embedding (hidden-sliced by AutoTP) instead of the head
CRASHES = (AssertionError, ValueError, KeyError)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=BIAS)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.embed_tokens(ids)))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    # ZeRO 3 with its default thresholds, as a user writes it.
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "tp": {"tp_grain_size": GRAIN}, "partition_config": {
                  "use_default_specs": False,
                  "layer_specs": [{"patterns": [r"embed_tokens\.weight$" if EMBEDDING else r"lm_head\.weight$"],
                                   **({"partition_type": "column", "gather_output": True} if COLUMN
                                      else {"partition_type": "row"})}]}}}
    if BF16:
        config["bf16"] = {"enabled": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    sharded = engine.module.embed_tokens.weight if EMBEDDING else engine.module.lm_head.weight
    shape = tuple(getattr(sharded, "ds_shape", sharded.shape))
    label = f"{'embedding' if EMBEDDING else 'head'} shard {shape}"
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    try:
        loss = engine(ids)
        result[rank] = f"{label}: loss {float(loss):.6f}"
        if BF16:  # one step, then the float32 master of the head shard, as a user reads it
            engine.backward(loss)
            engine.step()
            master = deepspeed.utils.safe_get_full_fp32_param(engine.module.lm_head.weight)
            result[rank] += f"; float32 master of the head shard: {None if master is None else tuple(master.shape)}"
    except CRASHES as exc:
        result[rank] = f"{result.get(rank, label)}; {type(exc).__name__} {str(exc)[:160]}"
    except RuntimeError as exc:  # the peer left the collective it was waiting in
        result[rank] = f"{label}: RuntimeError {str(exc).splitlines()[0][:100]}"


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Tiny()
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    print(f"plain torch loss: {float(model(ids)):.6f}")
    try:
        result = run_ranks(rank_main, TP * DP, env={"DS_ACCELERATOR": "cpu"}, timeout=90)
    except Exception as exc:  # a rank left hanging in a collective by its peer's assertion
        print(f"ranks did not finish: {type(exc).__name__}: {str(exc)[-600:]}")
        sys.exit(1)
    for rank in range(TP * DP):
        print(f"rank {rank}: {result.get(rank)}")
    raised = any(e.__name__ in str(r) for r in result.values() for e in CRASHES)
    print(f"ZeRO 3 (tp {TP} x dp {DP}) fails on the empty {'column' if COLUMN else 'row'} shard" if raised
          else "every rank computed a loss")
    sys.exit(1 if raised else 0)
