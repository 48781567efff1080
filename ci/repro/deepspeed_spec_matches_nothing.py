"""DeepSpeed 0.19.8: a partition_config layer spec that matches no parameter is accepted without a word, and the
output head it was written for stays a replicated nn.Linear.

Two ways a user's head spec misses (module_inject/autotp_config.py TPLayerSpec.matches):
- anchored: patterns are applied with ``re.match``, anchored at the start of the full parameter name. The
  documented meaning is "regex patterns to match parameter names"; ``lm_head\\.weight$`` does not match
  ``model.lm_head.weight`` (a head one level down, as in a wrapper holding the causal LM as ``.model``).
- model_types: a spec restricted with ``model_types: ["llama"]`` is skipped whenever AutoTP cannot derive the
  model's type: ``AutoTP._get_model_type`` reads ``config.model_type`` and otherwise looks for
  ...DecoderLayer / ...Block / ...Layer in the class name of the whole model, so a model without a config never
  matches.

With ``strict_mode`` off (its default) ``_replace_with_config`` returns the unmatched module unchanged, and nothing is
logged or warned: the head holds the whole [V, H] weight on every rank and no collective runs (the logits are plain
torch's, so only the memory and compute the user asked TP to split tell). Twins that match (the escaped full path;
the same model_types spec on the model given ``config.model_type = "llama"``) get a gathered ``LinearLayer`` holding
[V/P, H].

Run (CPU, about 30 s):  python ci/repro/deepspeed_spec_matches_nothing.py
Exit status 1 while a spec that matches nothing leaves the head a replicated nn.Linear silently; 0 once DeepSpeed
refuses such a spec or warns about it.

Finding: findings/deepspeed_spec_matches_nothing.toml
"""
import importlib
import io
import logging
import os
import sys
import types
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 35, 32


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)


class TinyLM(torch.nn.Module):
    """embed_tokens -> proj -> tanh -> head; the head at ``lm_head`` or, nested, at ``model.lm_head``."""

    def __init__(self, nested: bool):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        if nested:
            self.model = Nested()
        else:
            self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def head(self):
        return self.model.lm_head if hasattr(self, "model") else self.lm_head

    def forward(self, input_ids):
        return self.head()(torch.tanh(self.proj(self.embed_tokens(input_ids))))


HEAD_SPEC = {"partition_type": "column", "gather_output": True}
CASES = {
    # name: (nested head, model has config.model_type "llama", the head's spec, a spec that should miss)
    "anchored lm_head\\.weight$ on model.lm_head": (True, False, {"patterns": [r"lm_head\.weight$"]}, True),
    "escaped full path on model.lm_head": (True, False, {"patterns": [r"model\.lm_head\.weight$"]}, False),
    "model_types ['llama'], no config": (False, False, {"patterns": [r"lm_head\.weight$"], "model_types": ["llama"]},
                                         True),
    "model_types ['llama'], config.model_type 'llama'": (False, True, {"patterns": [r"lm_head\.weight$"],
                                                                        "model_types": ["llama"]}, False),
}


def run_case(rank, nested, with_config, spec):
    import deepspeed
    from deepspeed.utils import logger

    torch.manual_seed(0)
    model = TinyLM(nested)
    if with_config:
        model.config = types.SimpleNamespace(model_type="llama")
    config = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"proj\.weight$"], "partition_type": "skip"}, {**spec, **HEAD_SPEC}]}}}
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=config)
    finally:
        logger.removeHandler(handler)
    head = model.head()
    said = [line for line in log.getvalue().splitlines() if line.strip()] + [str(w.message) for w in caught]
    engine.destroy()
    return type(head).__name__, tuple(head.weight.shape), said


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result[rank] = {name: run_case(rank, nested, with_config, spec)
                    for name, (nested, with_config, spec, _) in CASES.items()}


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    silent_miss = False
    for name, (_, _, _, should_miss) in CASES.items():
        for rank in range(TP):
            kind, shape, said = result[rank][name]
            print(f"rank {rank}, {name}: head {kind} {list(shape)}; warnings/errors logged: {said or 'none'}")
            silent_miss |= should_miss and kind == "Linear" and shape == (VOCAB, HIDDEN) and not said
    print("WRONG: a head spec that matches nothing was accepted without a word; the head is whole on every rank"
          if silent_miss else "every spec that matches nothing was refused or reported")
    sys.exit(1 if silent_miss else 0)
