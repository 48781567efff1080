"""DeepSpeed 0.19.8: partition_config `strict_mode` refuses an unmatched Linear only when the AutoTP walk
reaches it, after the modules before it were already sharded in place: the refused deepspeed.initialize
leaves the user's model half-converted.

`strict_mode: true` promises "Fail if unmatched Linear layers found" (module_inject/autotp_config.py).
AutoTP._replace_with_config (module_inject/auto_tp.py) raises ValueError("No matching spec for ...") for
the first 2-D weight no spec matches, but _replace_module replaces each child in place as it walks the
model, so everything the walk met earlier is already a tensor-parallel layer holding this rank's slice.
A user who spec'd the blocks and forgot the head (the head comes last in a causal LM) gets the error and
a model whose `proj` is now a LinearLayer with a [H/P, H] weight: its state_dict and forward changed
(the forward now gives H/P features), without a word. The control, an unmatched `proj` met first,
leaves the modules as they were. Plain PyTorch/HF: a constructor that raises leaves its argument as it was.

Run (CPU, 2 processes over gloo, about 20 s):  python ci/repro/deepspeed_strict_mode_converts_model.py
Exit status 1 while a strict_mode refusal modifies the model, 0 once the model is left untouched.

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

    def forward(self, input_ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(input_ids))))


SPECS = {
    "lm_head unmatched (proj has a column spec, the head's was forgotten)":
        [{"patterns": [r"proj\.weight$"], "partition_type": "column"}],
    "proj unmatched (control: the first Linear the walk meets)":
        [{"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}],
}


def layout(model):
    return {name: (type(getattr(model, name)).__name__, tuple(getattr(model, name).weight.shape))
            for name in ("embed_tokens", "proj", "lm_head")}


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    for what, specs in SPECS.items():
        torch.manual_seed(0)
        model = TinyLM()
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "steps_per_print": 10**9,
                  "zero_optimization": {"stage": 0},
                  "tensor_parallel": {"autotp_size": TP, "partition_config": {
                      "use_default_specs": False, "strict_mode": True, "layer_specs": specs}}}
        before = layout(model)
        try:
            deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                 optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=config)
            outcome = "accepted"
        except ValueError as exc:
            outcome = f"ValueError: {exc}"
        after = layout(model)
        hidden = tuple(model.proj(torch.zeros(1, HIDDEN)).shape)  # what the user's proj now returns
        if rank == 0:
            result[what] = (outcome, before, after, hidden)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    converted = []
    for what, (outcome, before, after, hidden) in result.items():
        changed = {k: f"{before[k]} -> {after[k]}" for k in before if before[k] != after[k]}
        print(f"{what}:\n  initialize -> {outcome}\n  changed by the refused call (rank 0): {changed or 'nothing'}; "
              f"proj of a [1, {HIDDEN}] input now gives {hidden}")
        if changed:
            converted.append(what)
    print(f"HALF-CONVERTED after a strict_mode refusal: {converted}" if converted else "models left untouched")
    sys.exit(1 if converted else 0)
