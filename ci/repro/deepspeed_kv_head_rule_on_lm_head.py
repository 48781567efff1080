"""DeepSpeed 0.19.8: AutoTP splits a vocabulary-parallel output head by the model's attention-head count
unless the head's FULL name is exactly lm_head or embed_out.

tp_shard.get_shard_size (tp_shard.py:102-123) takes the kv-head branch, shards proportional to K heads, for any
layer whose size K divides and whose name is not in last_linear = ["lm_head", "embed_out"] (:104), compared with the
whole dotted name (:121). The head itself is found by its LAST name segment (auto_tp._is_lm_head_name, :683-686,
which also honours partition_config.lm_head_patterns), and VocabParallelLinear passes its full name to the split
(layers.py:574-582, _freeze_partition_sizes with self.name). K is read off model.config (AutoTPMeta.from_model_config:
num_key_value_heads first, then ... num_attention_heads; text_config descended into), as an HF model carries.

So the same head on the same model (vocab 36, tp 2, a config naming 6 query / 3 key-value heads) is split
- 18/18 when it is the model's top-level `lm_head` (the near-even rule DeepSpeed keeps for output heads),
- 24/12 when it is nested (`model.lm_head`: a PEFT-wrapped model's `base_model.model.lm_head`, a composite model's
  `language_model.lm_head`) or named `output` and selected with lm_head_patterns: ["output"];
and with one key/value head (multi-query attention) the nested head gets 36/0 and deepspeed.initialize refuses
the model ("requires nonempty vocabulary shards"), which the top-level head trains. The uneven split changes no
number (head, tied embedding and loss share the bounds), but it is not the documented near-even layout, it
unbalances the ranks, and it turns DeepSpeed's Liger CE off (its gate needs equal shards: 36 over 2 could have them).

Run (CPU, 2 processes over gloo, about 25 s):  python ci/repro/deepspeed_kv_head_rule_on_lm_head.py
Exit status 1 while a nested or lm_head_patterns head is split otherwise than the top-level lm_head.

Finding: findings/deepspeed_kv_head_rule_on_lm_head.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 36, 8


class Config:
    """What an HF model carries as model.config (only the fields AutoTP reads)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Tiny(nn.Module):
    def __init__(self, head: str, config):
        super().__init__()
        self.config = config
        self.head_path = head
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        owner = self
        *parents, leaf = head.split(".")
        for part in parents:
            setattr(owner, part, nn.Module())
            owner = getattr(owner, part)
        setattr(owner, leaf, nn.Linear(HIDDEN, VOCAB))
        self.loss_function = None  # the engine installs its vocabulary-parallel loss here

    def head(self):
        owner = self
        for part in self.head_path.split("."):
            owner = getattr(owner, part)
        return owner

    def forward(self, ids):
        logits = self.head()(torch.tanh(self.embed_tokens(ids)))
        return self.loss_function(logits=logits, labels=ids, vocab_size=VOCAB)


VARIANTS = [  # (head, kv heads in the config, lm_head_patterns)
    ("lm_head", 3, None),
    ("model.lm_head", 3, None),
    ("output", 3, ["output"]),
    ("lm_head", 1, None),
    ("model.lm_head", 1, None),
]


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.nn.functional as F

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    out = []
    for head, kv, patterns in VARIANTS:
        torch.manual_seed(0)
        model = Tiny(head, Config(num_attention_heads=6 if kv == 3 else 4, num_key_value_heads=kv))
        h = torch.tanh(model.embed_tokens(ids))
        # Plain PyTorch: HF's causal-LM loss (shift by one, mean over the targets).
        torch_loss = float(F.cross_entropy(model.head()(h)[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)))
        partition = {"use_default_specs": False, "layer_specs": [],
                     **({"lm_head_patterns": patterns} if patterns else {})}
        config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
                  "tensor_parallel": {"autotp_size": TP, "vocab_parallel_lm_head": True, "partition_config": partition}}
        try:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
        except Exception as exc:
            out.append((head, kv, f"initialize raised {type(exc).__name__}: {str(exc)[:120]}"))
            continue
        layer = model.head()
        loss = float(engine(ids))
        out.append((head, kv, [layer.vocab_start_index, layer.vocab_end_index], abs(loss - torch_loss)))
        engine.destroy()
    result[rank] = out


if __name__ == "__main__":
    ranks = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    split = {}
    for i, (head, kv, patterns) in enumerate(VARIANTS):
        rows = [ranks[r][i] for r in range(TP)]
        if isinstance(rows[0][2], str):
            split[(head, kv)] = rows[0][2]
            print(f"{head:14s} kv heads {kv}: {rows[0][2]}")
            continue
        split[(head, kv)] = [end - start for _, _, (start, end), _ in rows]
        print(f"{head:14s} kv heads {kv}{' lm_head_patterns ' + str(patterns) if patterns else ''}: "
              f"shards {split[(head, kv)]} (rank ranges {[r[2] for r in rows]}), "
              f"|loss - torch| {max(r[3] for r in rows):.1e}")
    near_even = split[("lm_head", 3)]
    wrong = [k for k, v in split.items() if v != near_even]
    print(f"MISMATCH: {wrong} not split {near_even} as the top-level lm_head" if wrong else "every head split alike")
    sys.exit(1 if wrong else 0)
