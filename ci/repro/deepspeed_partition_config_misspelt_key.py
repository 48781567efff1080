"""DeepSpeed 0.19.8: a misspelt key in tensor_parallel.partition_config is dropped without a word.

The tensor_parallel section is a pydantic model that refuses an unknown key (``tp_overlap_com``: "Extra inputs are
not permitted"), but its ``partition_config`` is a free dict (``TPTrainingConfig.partition_config: Dict[str, Any]``)
that ``AutoTPConfig.from_dict`` (module_inject/autotp_config.py:284-318) reads key by key with ``.get`` and a
default. A misspelt key is therefore dropped, and the layer spec falls back to the default it was meant to change:

- ``"gather_outputs": true`` (for ``gather_output``) on the head's column spec: the head becomes a column
  LinearLayer without gather, and the model gets this rank's ``[.., V/P]`` logits for a vocabulary of V; its loss
  then runs on them (here: a cross entropy over 8 of 16 classes, a number, no error);
- ``"pattern": "lm_head\\.weight$"`` (for ``patterns``, a list): the spec has no patterns, matches nothing, and the
  head stays the user's replicated ``nn.Linear`` (full logits, no TP: the memory the user meant to split is not).

Run (CPU, about 20 s):
  python ci/repro/deepspeed_partition_config_misspelt_key.py
Exit status 1 while a misspelt key is accepted, 0 once it is refused.

Finding: findings/deepspeed_partition_config_misspelt_key.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 16, 8
SPECS = {
    "gather_outputs": {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_outputs": True},
    "pattern": {"pattern": r"lm_head\.weight$", "partition_type": "column", "gather_output": True},
}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.embed_tokens(ids)))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1) % logits.shape[-1])
        return loss, logits


def rank_main(rank, result, key):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False,
                                                                          "layer_specs": [SPECS[key]]}}}
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    except Exception as exc:  # noqa: BLE001 - any refusal is what the user should get
        result[rank] = f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        return
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        loss, logits = engine(ids)
    head = engine.module.lm_head
    result[rank] = (f"accepted: lm_head a {type(head).__name__} {tuple(head.weight.shape)}, "
                    f"gather_output={getattr(head, 'gather_output', None)}; logits {tuple(logits.shape)} for a "
                    f"vocabulary of {VOCAB}, loss {loss.item():.6f}")


if __name__ == "__main__":
    accepted = False
    try:
        probe = importlib.import_module("deepspeed.runtime.tensor_parallel.config").TPTrainingConfig
        probe(autotp_size=TP, tp_overlap_com=True)
    except Exception as exc:  # noqa: BLE001
        print(f"the tensor_parallel section itself, key 'tp_overlap_com': {type(exc).__name__}: "
              f"{str(exc).splitlines()[2].strip()}")
    for key in SPECS:
        try:
            result = run_ranks(rank_main, TP, key, env={"DS_ACCELERATOR": "cpu"}, timeout=120)
        except Exception as exc:  # a rank left in a collective by its peer's error
            print(f"layer spec key {key!r}: ranks did not finish: {type(exc).__name__}: {str(exc)[-400:]}")
            sys.exit(1)
        print(f"layer spec key {key!r}: rank 0 {result.get(0)}")
        accepted |= str(result.get(0)).startswith("accepted")
    print("a misspelt partition_config key was accepted without a word" if accepted else "misspelt keys refused")
    sys.exit(1 if accepted else 0)
