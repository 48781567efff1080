"""DeepSpeed 0.19.8: partition_config `embedding_partition_dim` is parsed and ignored; a spec'd embedding
is always cut along its hidden dimension.

AutoTPConfig.embedding_partition_dim (module_inject/autotp_config.py; default 1, "Usually partition vocab
dim") is read from the config and merged with a preset, and read nowhere else: AutoTP._slice_embedding
(module_inject/auto_tp.py) always splits the weight with `split(..., dim=1)` into an nn.Embedding(V, H/P).
A user who asks for 0 (the vocabulary rows of the [V, H] table: every rank's lookup then whole, as a
vocabulary-parallel embedding gives, so the next Linear stays replicated) gets the same hidden slice as
with 1, no error or warning at initialize, and the model's first forward fails inside the replicated
Linear with a shape error that does not name the option ("mat1 and mat2 shapes cannot be multiplied").
Plain PyTorch computes the loss.

Run (CPU, 2 processes over gloo, about 20 s):  python ci/repro/deepspeed_embedding_partition_dim_ignored.py
Exit status 1 while embedding_partition_dim 0 gives the hidden slice, 0 once it does not.

Finding: findings/deepspeed_embedding_partition_dim_ignored.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    for dim in (1, 0):
        torch.manual_seed(0)
        model = Tiny()
        full = model.embed_tokens.weight.detach().clone()
        # dim 0: the embedding's output is whole on every rank, so proj is replicated (skip); dim 1: proj row.
        proj = "skip" if dim == 0 else "row"
        config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "steps_per_print": 10**9,
                  "zero_optimization": {"stage": 0},
                  "tensor_parallel": {"autotp_size": TP, "partition_config": {
                      "use_default_specs": False, "embedding_partition_dim": dim, "layer_specs": [
                          {"patterns": [r"embed_tokens\.weight$"], "partition_type": "row"},
                          {"patterns": [r"proj\.weight$"], "partition_type": proj},
                          {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
        shard = engine.module.embed_tokens.weight.detach()
        cols = HIDDEN // TP
        is_hidden_slice = tuple(shard.shape) == (VOCAB, cols) and torch.equal(shard, full[:, rank * cols:(rank + 1) * cols])
        try:
            outcome = f"loss {float(engine(ids).detach()):.6f}"
        except RuntimeError as exc:
            outcome = f"RuntimeError: {exc}"
        engine.destroy()
        result[(rank, dim)] = (tuple(shard.shape), is_hidden_slice, outcome)
    torch.manual_seed(0)
    result[(rank, "torch")] = float(Tiny()(ids))


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    print(f"plain PyTorch loss: {result[(0, 'torch')]:.6f}; embedding [V, H] = [{VOCAB}, {HIDDEN}], TP = {TP}")
    for dim in (1, 0):
        for rank in range(TP):
            shape, hidden, outcome = result[(rank, dim)]
            print(f"embedding_partition_dim {dim}, rank {rank}: embed_tokens.weight {shape}"
                  f"{' = columns ' + str(rank * (HIDDEN // TP)) + ':' + str((rank + 1) * (HIDDEN // TP)) if hidden else ''}; "
                  f"first forward: {outcome}")
    ignored = all(result[(rank, 0)][1] for rank in range(TP))
    print("IGNORED: embedding_partition_dim 0 gives the hidden slice of dim 1" if ignored else "dim 0 honoured")
    sys.exit(1 if ignored else 0)
