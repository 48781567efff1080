"""DeepSpeed 0.19.8: a column spec on lm_head without `gather_output` is accepted and hands the model
vocabulary-sharded logits.

A user shards the head with `partition_config` `{"patterns": ["lm_head\\.weight$"], "partition_type":
"column"}` and leaves `gather_output` at its default (false). Plain PyTorch gives the model
[batch, seq, vocab] logits; `deepspeed.initialize` accepts the spec without a warning, builds a
`LinearLayer` that returns this rank's [batch, seq, vocab/P] block, and installs no vocabulary-parallel
loss. The model's own full-vocabulary loss, greedy decoding or sampling then run on a slice of the
vocabulary: an HF loss fails on the shape, argmax silently picks a per-rank token (here it agrees with
the full-vocabulary argmax on a fraction of the tokens). The fix would be a refusal (or a gather);
the vocabulary-parallel path is `vocab_parallel_lm_head: true`.

The same head comes from a HuggingFace tp_plan that gives lm_head the plain "colwise" style (no
partition_config: the engine converts the model's plan, tp_plan_converter.py:58-60 sets gather_output
only for colwise_rep / colwise_gather_output). Both routes are run here.

Run (CPU, about 15 s):  python ci/repro/deepspeed_column_head_without_gather.py
Exit status 1 while the engine returns logits narrower than the vocabulary, 0 once it refuses the spec
or returns full logits.

Finding: findings/deepspeed_column_head_without_gather.toml
"""
import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 35, 32


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


SPEC = {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
    {"patterns": [r"proj\.weight$"], "partition_type": "skip"},
    {"patterns": [r"lm_head\.weight$"], "partition_type": "column"}]}}
ROUTES = {"partition_config column spec": (SPEC, None),
          'HF tp_plan {"lm_head": "colwise"}': ({"autotp_size": TP}, {"lm_head": "colwise"})}


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    for route, (tensor_parallel, tp_plan) in ROUTES.items():
        torch.manual_seed(0)
        model = Tiny()
        plain = copy.deepcopy(model)
        if tp_plan:
            model._tp_plan = tp_plan  # where transformers keeps a model's plan; DeepSpeed reads it
        config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                  "zero_optimization": {"stage": 0}, "steps_per_print": 10**9, "tensor_parallel": tensor_parallel}
        try:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
        except (ValueError, NotImplementedError) as exc:  # a refusal is the fix
            result[(route, rank)] = f"raised {type(exc).__name__}: {exc}"
            continue
        ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            logits, full = engine(ids), plain(ids)
        offset = [0, 18][rank]  # this rank's first vocabulary row (35 over 2: 18, 17)
        agree = float((logits.argmax(-1) + offset == full.argmax(-1)).float().mean())
        result[(route, rank)] = (tuple(logits.shape), tuple(full.shape), type(model.lm_head).__name__, agree)
        engine.destroy()


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    wrong = False
    for (route, rank), outcome in sorted(result.items()):
        if isinstance(outcome, str):
            print(f"{route}, rank {rank}: deepspeed.initialize {outcome}")
            continue
        got, want, head, agree = outcome
        wrong |= got != want
        print(f"{route}, rank {rank}: lm_head became {head}; logits {got}, plain PyTorch {want}; argmax agrees "
              f"with the full-vocabulary argmax on {agree:.0%} of tokens")
    print("WRONG: accepted, and the model gets vocabulary-sharded logits" if wrong else "refused or gathered")
    sys.exit(1 if wrong else 0)
