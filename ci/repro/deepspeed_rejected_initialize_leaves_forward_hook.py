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

Finding: findings/deepspeed_refused_initialize_leaves_state.toml
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402
# The same refusal as the training-mode reproducer's, on the same model.
from deepspeed_rejected_initialize_leaves_training_mode import TP, refused_initialize, tiny_model  # noqa: E402


def rank_main(rank, result):
    model = tiny_model()
    before = len(model._forward_pre_hooks)
    outcome = refused_initialize(model)
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
