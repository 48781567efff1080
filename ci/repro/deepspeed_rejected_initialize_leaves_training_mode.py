"""DeepSpeed 0.19.8: a refused deepspeed.initialize leaves AutoTP's process-global training mode on.

deepspeed.initialize calls `set_autotp_mode(training=True)` (deepspeed/__init__.py:552) before the
tensor-parallel config is validated, and nothing sets it back when the engine then raises. The
switch is a module global (module_inject/layers.py:35) that later, unrelated calls in the same
process read: `deepspeed.init_inference` never resets it, and in training mode it skips kernel
injection and the mp-checkpoint save (replace_module.py:333, :489), and directly built AutoTP layers
keep requires_grad. A refusal that a user catches (or a launcher that retries) changes what the
process does next. (A successful training initialize leaves it on too; that is its design. The
finding is the refusal: the call did nothing the user can use, yet changed process state.)

Run (CPU, 2 processes over gloo, about 20 s; `tp.tp_size` != `autotp_size` is refused with a ValueError):
python ci/repro/deepspeed_rejected_initialize_leaves_training_mode.py
Exit status 1 while the refused initialize leaves training mode on, 0 once it is left as it was.

Finding: findings/deepspeed_refused_initialize_leaves_state.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def tiny_model():
    model = nn.Sequential(nn.Linear(8, 8))
    model.lm_head = nn.Linear(8, 10)
    return model


def refused_initialize(model) -> str:
    """deepspeed.initialize on ``model`` with a tensor-parallel config it refuses before AutoTP shards
    anything (`tp.tp_size` != `autotp_size`); how the call ended. Also what
    deepspeed_rejected_initialize_leaves_forward_hook.py refuses."""
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
           "tensor_parallel": {"autotp_size": TP, "tp": {"tp_size": TP + 1},
                               "partition_config": {"use_default_specs": False, "layer_specs": [
                                   {"patterns": [r"lm_head\.weight$"], "partition_type": "column",
                                    "gather_output": True}]}}}
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(),
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=cfg)
        return "accepted"
    except Exception as exc:  # noqa: BLE001 - any refusal will do; the point is what it left
        return f"{type(exc).__name__}: {str(exc)[:100]}"


def rank_main(rank, result):
    from deepspeed.module_inject.layers import is_autotp_training_mode

    before = is_autotp_training_mode()
    outcome = refused_initialize(tiny_model())
    if rank == 0:
        result.update(outcome=outcome, before=before, after=is_autotp_training_mode())


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    print(f"initialize -> {result['outcome']}")
    print(f"AutoTP training mode before: {result['before']}, after the refused call: {result['after']}")
    sys.exit(1 if result["after"] != result["before"] else 0)
