"""DeepSpeed 0.19.8: `vocab_parallel_lm_head: true` with a partition_config refuses a model with two qualifying
heads only after sharding both: the refused deepspeed.initialize leaves the user's model half-converted.

A model with a multi-token-prediction head beside lm_head has two Linears that qualify as the vocabulary-parallel
head: `mtp_head` once the user lists it in `partition_config.lm_head_patterns`, or a nested `mtp.lm_head` (the
default patterns match the last name segment, auto_tp.py:683-686). DeepSpeed has a check that refuses this before
touching the model, `AutoTP._resolve_vocab_parallel_lm_head` (auto_tp.py:780-800, "Unable to choose among multiple
vocab-parallel LM heads"), and the heuristic and HF tp_plan paths call it before their walk (engine.py:1168,1215).
The partition_config path does not: its walk (`_replace_with_config`) makes every qualifying head a
VocabParallelLinear holding this rank's [V/P, H] slice, and only `finalize_autotp` then refuses ("Unable to choose a
loss for multiple no-gather vocab-parallel LM heads", engine.py:1062-1063). A user who catches the error holds a
model whose two heads are sharded (changed state_dict, [.., V/P] logits). The control, the same model with no
partition_config (the heuristic path), is refused with the model untouched.
Plain PyTorch/HF: a constructor that raises leaves its argument as it was.

Run (CPU, 2 processes over gloo, about 15 s):  python ci/repro/deepspeed_two_vocab_heads_converts_model.py
Exit status 1 while a partition_config refusal modifies the model, 0 once every refusal leaves it untouched.

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
SKIP_PROJ = {"patterns": [r"proj\.weight$"], "partition_type": "skip"}


class MTPLM(nn.Module):
    """lm_head plus a second head at ``second`` ("mtp_head", or "mtp.lm_head" nested in a module of its own)."""

    def __init__(self, second):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)
        if "." in second:
            self.mtp = nn.Module()
            self.mtp.lm_head = nn.Linear(HIDDEN, VOCAB)
        else:
            setattr(self, second, nn.Linear(HIDDEN, VOCAB))
        self.loss_function = None  # HF-style hook the engine replaces with its vocab-parallel loss

    def forward(self, input_ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(input_ids))))


CASES = {
    "partition_config, mtp_head in lm_head_patterns": (
        "mtp_head", {"partition_config": {"use_default_specs": False, "lm_head_patterns": ["lm_head", "mtp_head"],
                                          "layer_specs": [SKIP_PROJ]}}),
    "partition_config, nested mtp.lm_head": (
        "mtp.lm_head", {"partition_config": {"use_default_specs": False, "layer_specs": [SKIP_PROJ]}}),
    "no partition_config (heuristic path; control), nested mtp.lm_head": ("mtp.lm_head", {}),
}


def layout(model):
    return {name: (type(module).__name__, tuple(module.weight.shape))
            for name, module in model.named_modules() if name in ("lm_head", "mtp_head", "mtp.lm_head")}


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    for what, (second, tp_config) in CASES.items():
        torch.manual_seed(0)
        model = MTPLM(second)
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "steps_per_print": 10**9,
                  "zero_optimization": {"stage": 0},
                  "tensor_parallel": {"autotp_size": TP, "vocab_parallel_lm_head": True, **tp_config}}
        before = layout(model)
        try:
            deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                 optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=config)
            outcome = "accepted"
        except ValueError as exc:
            outcome = f"ValueError: {exc}"
        after = layout(model)
        logits = tuple(model(torch.zeros(1, 3, dtype=torch.long)).shape)  # what the user's model now returns
        if rank == 0:
            result[what] = (outcome, before, after, logits)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    converted = []
    for what, (outcome, before, after, logits) in result.items():
        changed = {k: f"{before[k]} -> {after[k]}" for k in before if before[k] != after[k]}
        print(f"{what}:\n  initialize -> {outcome}\n  changed by the refused call (rank 0): {changed or 'nothing'}; "
              f"the model's logits for a [1, 3] batch: {logits} (vocabulary {VOCAB})")
        if changed:
            converted.append(what)
    print(f"HALF-CONVERTED after a refusal: {converted}" if converted else "models left untouched")
    sys.exit(1 if converted else 0)
