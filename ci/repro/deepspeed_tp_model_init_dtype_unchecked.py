"""DeepSpeed 0.19.8: tp_model_init's dtype is never checked against a float32 config, and is dropped.

A user calls deepspeed.tp_model_init(model, tp_size=2, dtype=torch.bfloat16) and then deepspeed.initialize with a
config that enables neither bf16 nor fp16. tp_model_init's docstring lists dtype among the fields whose mismatch
raises ("Error on mismatch: autotp_size, dtype, tp_group size or identity"), and a bf16 config told float32 does
raise ("Conflicting dtype"). But merge_tp_model_init_into_config (runtime/tensor_parallel/init_utils.py:130-132)
compares only with the dtype infer_config_dtype finds, which is None unless bf16 or fp16 is enabled (69-76): the
float32 config is accepted, the dtype asked for is dropped, and the model trains in float32 without a word.

Run (CPU, 2 processes over gloo, 30-90 s): python ci/repro/deepspeed_tp_model_init_dtype_unchecked.py
Exit status 1 while both configs do not raise alike, 0 once the float32 config is refused too (or honours bf16).

Finding: findings/deepspeed_tp_model_init_dtype_unchecked.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.lm_head(self.embed_tokens(ids))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    from deepspeed.module_inject import layers
    from deepspeed.runtime.tensor_parallel import init_utils

    deepspeed.init_distributed(dist_backend="gloo")
    for label, told, extra in (("bf16 config, tp_model_init told float32", torch.float32, {"bf16": {"enabled": True}}),
                               ("float32 config, tp_model_init told bfloat16", torch.bfloat16, {})):
        init_utils._TP_MODEL_INIT_ARGS = None  # DeepSpeed never clears tp_model_init's record between models
        layers.set_autotp_mode(training=False)
        model = Tiny()
        deepspeed.tp_model_init(model, tp_size=TP, dtype=told)
        config = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
                  "tensor_parallel": {"partition_config": {"use_default_specs": False, "layer_specs": [
                      {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}},
                  **extra}
        try:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
        except ValueError as exc:
            result[(rank, label)] = f"raised ValueError: {exc}"
            continue
        result[(rank, label)] = (f"accepted: lm_head became {type(model.lm_head).__name__}, trains in "
                                 f"{engine.module.lm_head.weight.dtype}")
        engine.destroy()


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    outcomes = {}
    for (rank, label), outcome in sorted(result.items()):
        print(f"rank {rank}: {label}: {outcome}")
        outcomes.setdefault(label, set()).add(outcome.startswith("raised"))
    wrong = {frozenset(v) for v in outcomes.values()} != {frozenset({True})}
    print("WRONG: the float32 config is accepted and tp_model_init's dtype dropped" if wrong
          else "both conflicts refused")
    sys.exit(1 if wrong else 0)
