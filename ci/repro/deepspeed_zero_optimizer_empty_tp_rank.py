"""DeepSpeed 0.19.8: ZeRO 1/2 cannot be built on a TP rank that AutoTP left only empty shards.

With ``tp_grain_size`` 2 over tp 2, AutoTP gives TP rank 0 every hidden column and every vocabulary row of a
hidden-2, vocabulary-2 model (a spec'd row embedding [2, 2] / [2, 0], a row proj [2, 2] / [2, 0], a gathered
column head [2, 2] / [0, 2]; no bias): TP rank 1 holds nothing but zero-element parameters. deepspeed.initialize
converts the model and then builds the ZeRO 1/2 optimizer, which leaves zero-element parameters out of its
groups (runtime/utils.py is_optimized_parameter) and then reads the group's first parameter's dtype
(stage_1_and_2.py: ``param_dtype = self.bit16_groups[i][0].dtype``): ``IndexError: list index out of range`` on
TP rank 1, while TP rank 0 finishes initialize and waits in the first forward's TP data check until its peer's
exit closes it. ZeRO 0 trains the model in fp32; plain torch (one rank, the whole model) trains it. bf16 with fp32
gradient accumulation builds BF16_Optimizer instead, whose flattening of the empty group raises ``ValueError:
torch.cat(): expected a non-empty list of Tensors`` (``--bf16-optimizer``). Found by parity explore --budget 1800
(seed 1) on embed_spec_untied, shrunk to vocabulary 2, hidden 2, no bias, ZeRO 1, grain 2. bf16 at ZeRO 0
(``--dtype bf16 --zero 0``): the engine's unfused bf16 optimizer is built, and its step joins the norm's
model-parallel all-reduce only where the rank has a gradient to measure (fp16/unfused_optimizer.py:212-213,
``if len(grads_for_norm) > 0: get_weight_norm(...)``): TP rank 1 skips it and finishes its step while TP rank 0
waits in it, then loses its peer. Over more steps the ranks' collectives pair up wrongly (in the suite's two-step
case gloo sees 12 bytes where 4 were expected and aborts TP rank 0; a pairing of equal sizes would pass unnoticed).
ZeRO 3 (``--zero 3``): the stage 3 optimizer's construction defragments the rank's empty set of partitions and
fails a bare ``assert len(set(t.dtype for t in tensors)) == 1`` (zero/utils.py:218) inside deepspeed.initialize.
Related: an empty shard among non-empty ones trains under
ZeRO 1/2 (the gathered head's empty vocabulary shard, cases/deepspeed_heads.toml); BF16_Optimizer and ZeRO 3 fail
on any empty shard (deepspeed_bf16_optimizer_empty_row_shard.py, deepspeed_zero3_empty_row_shard.py).

Run (CPU, about 20 s):
  python ci/repro/deepspeed_zero_optimizer_empty_tp_rank.py            # ZeRO 1, fp32: IndexError on TP rank 1
  python ci/repro/deepspeed_zero_optimizer_empty_tp_rank.py --zero 2   # the same
  python ci/repro/deepspeed_zero_optimizer_empty_tp_rank.py --zero 3   # ZeRO 3: a bare assert in zero/utils.py defragment
  python ci/repro/deepspeed_zero_optimizer_empty_tp_rank.py --zero 0   # fp32 ZeRO 0: a step on both ranks
  python ci/repro/deepspeed_zero_optimizer_empty_tp_rank.py --bf16-optimizer  # BF16_Optimizer: ValueError (torch.cat)
  python ci/repro/deepspeed_zero_optimizer_empty_tp_rank.py --dtype bf16 --zero 0  # TP rank 0 lost in the norm's all-reduce
Exit status 1 while a rank fails, 0 once every rank takes its step.

Finding: findings/deepspeed_autotp_empty_shard_crashes.toml
"""
import importlib
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN, GRAIN = 2, 2, 2, 2
ZERO = int(sys.argv[sys.argv.index("--zero") + 1]) if "--zero" in sys.argv else 1
BF16_OPTIMIZER = "--bf16-optimizer" in sys.argv  # bf16 with fp32 gradient accumulation: ZeRO 1 builds BF16_Optimizer
DTYPE = "bf16" if BF16_OPTIMIZER else sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "fp32"


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": ZERO},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              **({"bf16": {"enabled": True}} if DTYPE == "bf16" else {}),
              **({"data_types": {"grad_accum_dtype": "fp32"}} if BF16_OPTIMIZER else {}),
              "tensor_parallel": {"autotp_size": TP, "tp": {"tp_grain_size": GRAIN}, "partition_config": {
                  "use_default_specs": False, "layer_specs": [
                      {"patterns": [r"embed_tokens\.weight$"], "partition_type": "row"},
                      {"patterns": [r"proj\.weight$"], "partition_type": "row"},
                      {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}}}
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    except (IndexError, ValueError, AssertionError) as exc:
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        # ZeRO 3's is a bare assert: name its statement
        first = str(exc).splitlines()[0][:100] if str(exc) else traceback.extract_tb(exc.__traceback__)[-1].line
        result[rank] = f"initialize raised {type(exc).__name__}: {first} (the model already converted: {shapes})"
        return
    except RuntimeError as exc:  # ZeRO 3: the other rank's initialize waits in a collective with the failed one
        result[rank] = f"initialize raised RuntimeError (its peer gone): {str(exc).splitlines()[0][:90]}"
        return
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    try:
        loss = engine(ids)
        engine.backward(loss)
        engine.step()
    except RuntimeError as exc:  # a collective of the first step (the forward's TP data check, the norm) lost its peer
        where = "the step's norm" if "get_weight_norm" in traceback.format_exc() else "the first step"
        result[rank] = f"initialize passed; {where} raised RuntimeError: {str(exc).splitlines()[0][:90]}"
        return
    shapes = {n: tuple(p.shape) for n, p in engine.module.named_parameters()}
    result[rank] = f"loss {float(loss.detach()):.6f}, step taken, shards {shapes}"


if __name__ == "__main__":
    try:
        result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, timeout=90)
    except Exception as exc:  # a rank left in a collective by its peer's error
        print(f"ranks did not finish: {type(exc).__name__}: {str(exc)[-600:]}")
        sys.exit(1)
    for rank in range(TP):
        print(f"rank {rank}: {result.get(rank)}")
    failed = any("raised" in str(r) for r in result.values()) or len(result) < TP
    print(f"ZeRO {ZERO}, {DTYPE}: " + ("a rank failed" if failed else "every rank took its step"))
    sys.exit(1 if failed else 0)
