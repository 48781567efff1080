"""DeepSpeed 0.19.8: `vocab_parallel_lm_head: true` on the heuristic AutoTP path fails with a RuntimeError, after
sharding the model, when the one output head is registered inside a transformer block.

A model whose head lives in a block of its ModuleList (as a per-block multi-token-prediction head does:
`layers.1.lm_head`) has exactly one Linear that qualifies as the vocabulary-parallel head (auto_tp.py:683-686 match
the last name segment). With no partition_config and no tp_plan the engine takes the heuristic path
(engine.py:1201-1231): a separate AutoTP resolves that head first (`_resolve_vocab_parallel_lm_head`, one candidate:
accepted), then `replace_transformer_layer` walks every block, and its own AutoTP, built with the same
`vocab_parallel_lm_head` (replace_module.py:302-310), meets the head inside block 1 and already makes it a
VocabParallelLinear (auto_tp.py:415-416). The separate AutoTP then finds the module it resolved gone and raises
`RuntimeError: Vocab-parallel LM head 'layers.1.lm_head' changed during AutoTP partitioning` (auto_tp.py:802-806), on
every rank, after the blocks and the head were sharded in place. No configuration error is named; the user's model
is left converted. With `vocab_parallel_lm_head: false` the same walk makes the block head a gathered column
LinearLayer and the model trains (the control below). Expected: the model trains with the vocabulary-parallel head,
or a refusal before any module is replaced.

Run (CPU, 2 processes over gloo, about 15 s):  python ci/repro/deepspeed_block_vocab_head_changed_during_partitioning.py
Exit status 1 while vocab_parallel_lm_head: true raises, 0 once it trains.

Finding: findings/deepspeed_block_vocab_head_changed_during_partitioning.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        return x + self.o_proj(torch.tanh(self.q_proj(x)))


class TinyMTPModel(nn.Module):
    """Llama-shaped blocks in a ModuleList (what the heuristic parser looks for); the output head registered in the
    last block, applied after the blocks."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.layers[1].lm_head = nn.Linear(HIDDEN, VOCAB)
        self.loss_function = None  # HF-style hook the engine replaces with its vocab-parallel loss

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for block in self.layers:
            x = block(x)
        return self.layers[1].lm_head(x)


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    for vocab_parallel in (True, False):
        torch.manual_seed(0)
        model = TinyMTPModel()
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "steps_per_print": 10**9,
                  "zero_optimization": {"stage": 0},
                  "tensor_parallel": {"autotp_size": TP, "vocab_parallel_lm_head": vocab_parallel}}
        try:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              optimizer=lambda p: torch.optim.SGD(p, lr=0.1), config=config)
            logits = engine(torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1)))
            outcome = f"trains: logits {tuple(logits.shape)}"
        except RuntimeError as exc:
            outcome = f"RuntimeError: {exc}"
        layout = {name: (type(m).__name__, tuple(m.weight.shape)) for name, m in model.named_modules()
                  if name in ("layers.0.q_proj", "layers.1.lm_head")}
        result[(rank, vocab_parallel)] = (outcome, layout)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    raised = []
    for (rank, vocab_parallel), (outcome, layout) in sorted(result.items(), key=lambda kv: (not kv[0][1], kv[0][0])):
        print(f"rank {rank}, vocab_parallel_lm_head {vocab_parallel}: {outcome}\n  the user's model after it: {layout}")
        if outcome.startswith("RuntimeError"):
            raised.append(rank)
    print(f"RAISED on ranks {raised} after the model was sharded" if raised else "the block head trains")
    sys.exit(1 if raised else 0)
