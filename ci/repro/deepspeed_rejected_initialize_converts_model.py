"""DeepSpeed 0.19.8: a refused deepspeed.initialize leaves the user's model half-converted.

AutoTP shards the model in place before some of its validations run. When one of those fails the
engine raises, but the model the user still holds already has its head swapped for a sharded layer:
`lm_head` is a `VocabParallelLinear` (or `LinearLayer`) holding this rank's [V/P, H] slice; its
state_dict, its shapes and its forward are no longer those of the model that was passed in, and a
user who catches the error (or a launcher that retries with another config) trains or saves the
half-converted model without a word. Three refusals show it:
- `vocab_parallel_lm_head: true` on a model without a writable `loss_function` ("requires ... a
  writable loss_function"): the head is already vocabulary-parallel when the ValueError is raised;
- `vocab_parallel_ce_backend: "liger"` with a column-gathered head spec (no vocabulary-parallel head):
  the head is already a gathered column-parallel LinearLayer;
- ZeRO 2 with `prescale_gradients: true` (or `gradient_predivide_factor` != 1), a data-parallel option
  ZeRO 2's reduce-scatter does not support: Stage1And2ZeroOptimizer asserts (stage_1_and_2.py:350-351),
  but the engine builds it after AutoTP sharded the model, so the head is already vocabulary-parallel;
  and the refused engine has already registered its forward pre-hook on the model, so the user's next
  forward raises AttributeError ('DeepSpeedEngine' object has no attribute 'engine_timers') from an
  engine that does not exist for the user;
- `torch_autocast` settings init_autocast_params refuses (engine.py:670, after AutoTP's replacement at :596): a
  `lower_precision_safe_modules` entry that does not import (the head's class misspelt: "Failed to import lower
  precision safe module"), and autocast with ZeRO 3's `zero_quantized_weights` ("Cannot enable both torch autocast
  and zero quantized weights"): the head is already vocabulary-parallel, the engine's forward hooks are on it.
Plain PyTorch/HF: a constructor that raises leaves its argument as it was.

Run (CPU, 2 processes over gloo, about 60 s):
python ci/repro/deepspeed_rejected_initialize_converts_model.py
Exit status 1 while a refused initialize modifies the model, 0 once the model is left untouched.

Finding: findings/deepspeed_refused_initialize_leaves_state.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)
        self.loss_function = None

    def forward(self, input_ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(input_ids))))


class NoLossFunctionLM(TinyLM):
    def __init__(self):
        super().__init__()
        del self.loss_function  # the engine cannot install its vocabulary-parallel loss


def config(tensor_parallel):
    specs = [{"patterns": [r"proj\.weight$"], "partition_type": "skip"}]
    return {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "steps_per_print": 10**9,
            "zero_optimization": {"stage": 0},
            "tensor_parallel": {"autotp_size": TP, **tensor_parallel,
                                "partition_config": {"use_default_specs": False, "layer_specs": specs}}}


REFUSALS = {
    "vocab_parallel_lm_head without a writable loss_function":
        (NoLossFunctionLM, config({"vocab_parallel_lm_head": True})),
    "liger backend without a vocab-parallel head":
        (TinyLM, config({"vocab_parallel_ce_backend": "liger"})),
}
REFUSALS["liger backend without a vocab-parallel head"][1]["tensor_parallel"]["partition_config"]["layer_specs"].append(
    {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True})
REFUSALS["ZeRO 2 with prescale_gradients"] = (TinyLM, {
    **config({"vocab_parallel_lm_head": True}),
    "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "prescale_gradients": True})
AUTOCAST = {"enabled": True, "dtype": "bfloat16"}
REFUSALS["torch_autocast lower_precision_safe_modules naming a misspelt class"] = (TinyLM, {
    **config({"vocab_parallel_lm_head": True}),
    "torch_autocast": {**AUTOCAST, "lower_precision_safe_modules": [
        "torch.nn.modules.linear.Linear", "deepspeed.module_inject.layers.VocabParallelLinaer"]}})
REFUSALS["torch_autocast with ZeRO 3 zero_quantized_weights"] = (TinyLM, {
    **config({"vocab_parallel_lm_head": True}), "torch_autocast": AUTOCAST,
    "zero_optimization": {"stage": 3, "zero_quantized_weights": True}, "zero_allow_untested_optimizer": True})


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    for what, (build, cfg) in REFUSALS.items():
        torch.manual_seed(0)
        model = build()
        before = (type(model.lm_head).__name__, tuple(model.state_dict()["lm_head.weight"].shape))
        try:
            deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                 optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=cfg)
            outcome = "accepted"
        except (ValueError, NotImplementedError, AssertionError) as exc:
            outcome = f"{type(exc).__name__}: {str(exc)[:90]}"
        after = (type(model.lm_head).__name__, tuple(model.state_dict()["lm_head.weight"].shape))
        try:  # the model still runs: a user can keep training it
            logits = f"logits {tuple(model(torch.tensor([[1, 2, 3]])).shape)}"
        except Exception as exc:  # noqa: BLE001 - what the user's next forward meets is the finding
            logits = f"{type(exc).__name__}: {str(exc)[:90]}"
        if rank == 0:
            result[what] = (outcome, before, after, logits)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    converted = []
    for what, (outcome, before, after, logits) in result.items():
        print(f"{what}:\n  initialize -> {outcome}\n  lm_head before: {before[0]} weight {before[1]}; "
              f"after: {after[0]} weight {after[1]}; the model's forward then gives: {logits}")
        if before != after:
            converted.append(what)
    print(f"HALF-CONVERTED after a refused initialize: {converted}" if converted else "models left untouched")
    sys.exit(1 if converted else 0)
