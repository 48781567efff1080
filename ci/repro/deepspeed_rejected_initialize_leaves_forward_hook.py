"""DeepSpeed 0.19.8: a refused deepspeed.initialize leaves a collective forward pre-hook on the user's model.

With tensor parallelism the engine registers, on the model the user passed, a forward pre-hook that
checks the first forward's inputs are the same on every TP rank (`check_dataloader_inputs_same_across_ranks`,
DeepSpeedEngine._configure_tensor_parallel_states, engine.py:962-1007): it broadcasts the inputs over
the TP group, asserts they agree, and removes itself. It is registered before the rest of the setup is
validated, and nothing removes it when the engine then raises. The model the user still holds (here
untouched otherwise: `tp.tp_size` != `autotp_size` is refused before AutoTP shards anything) now runs
a collective in its next forward: where the ranks feed different inputs (a user who falls back to plain
data-parallel training or evaluation after the refusal) it raises "Data inconsistency within the TP
group"; a rank that forwards alone waits for peers that never come. Every engine refusal of the suite
leaves it (cases/deepspeed_rejects.toml, `state_after_rejection`). Plain PyTorch/HF: a constructor that
raises leaves its argument as it was.

Run (CPU, 2 processes over gloo, about 20 s):
python ci/repro/deepspeed_rejected_initialize_leaves_forward_hook.py
Exit status 1 while the refused initialize leaves the hook, 0 once the model is left without it.
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    model = nn.Sequential(nn.Linear(8, 8))
    model.lm_head = nn.Linear(8, 10)
    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
           "tensor_parallel": {"autotp_size": TP, "tp": {"tp_size": TP + 1},
                               "partition_config": {"use_default_specs": False, "layer_specs": [
                                   {"patterns": [r"lm_head\.weight$"], "partition_type": "column",
                                    "gather_output": True}]}}}
    before = len(model._forward_pre_hooks)
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(),
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=cfg)
        outcome = "accepted"
    except Exception as exc:  # noqa: BLE001 - any refusal will do; the point is what it left
        outcome = f"{type(exc).__name__}: {str(exc)[:90]}"
    hooks = [getattr(h, "__qualname__", repr(h)) for h in model._forward_pre_hooks.values()]
    try:  # each rank its own input, as plain data-parallel work after the refusal would have
        forward = f"logits {tuple(model(torch.full((1, 8), float(rank))).shape)}"
    except Exception as exc:  # noqa: BLE001 - what the user's next forward meets is the finding
        forward = f"{type(exc).__name__}: {str(exc)[:120]}"
    if rank == 0:
        result.update(outcome=outcome, before=before, hooks=hooks, forward=forward)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    print(f"initialize -> {result['outcome']}")
    print(f"forward pre-hooks on the model before: {result['before']}, after the refused call: {result['hooks']}")
    print(f"the model's next forward (different inputs per rank) -> {result['forward']}")
    sys.exit(1 if len(result["hooks"]) != result["before"] else 0)
