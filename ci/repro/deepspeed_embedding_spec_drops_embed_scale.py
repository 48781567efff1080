"""DeepSpeed 0.19.8: a Gemma3 scaled word embedding matched by a partition_config spec loses its embed_scale.

A user shards the input embedding of a Gemma3-style model: `partition_config` specs `embed_tokens.weight`
(row) and the Linear that reads it, `proj.weight` (row); the embedding is transformers'
`Gemma3TextScaledWordEmbedding`, whose forward multiplies every lookup by `embed_scale` (sqrt(hidden)).
The spec path takes any `nn.Embedding` subclass (`isinstance`, `auto_tp.py:1069`) to
`AutoTP._slice_embedding`, which rebuilds it as a bare `nn.Embedding(V, H/P)` (`auto_tp.py:913`): the
subclass's forward, and with it the scale, is gone. The model trains on unscaled embeddings: the logits
and the loss differ from plain PyTorch's from the first forward, without a word. (The same rebuild drops
padding_idx: `deepspeed_embedding_spec_padding_idx.py`; DeepSpeed's own embedding layers,
VocabParallelEmbedding and HiddenParallelEmbedding, accept this class by name and keep its scale.)

Run (CPU, 2 ranks, about 20 s):  python ci/repro/deepspeed_embedding_spec_drops_embed_scale.py
Exit status 1 while the loss differs from plain PyTorch's, 0 once it matches (or the spec is refused).

Finding: findings/deepspeed_embedding_spec_bare_rebuild.toml
"""
import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32


def tiny():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = Gemma3TextScaledWordEmbedding(VOCAB, HIDDEN, None, embed_scale=HIDDEN ** 0.5)
            self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
            self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

        def forward(self, ids):
            logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
            return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    return Tiny()


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = tiny()
    plain = copy.deepcopy(model)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"embed_tokens\.weight$"], "partition_type": "row"},
                  {"patterns": [r"proj\.weight$"], "partition_type": "row"},
                  {"patterns": [r"lm_head\.weight$"], "partition_type": "skip"}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        loss, want = float(engine(ids)), float(plain(ids))
    embedding = model.embed_tokens
    result[rank] = (type(embedding).__name__, tuple(embedding.weight.shape), hasattr(embedding, "embed_scale"),
                    loss, want)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    for rank in range(TP):
        kind, shape, scaled, loss, want = result[rank]
        print(f"rank {rank}: embed_tokens after initialize: {kind}{list(shape)}, has embed_scale: {scaled}; "
              f"loss DeepSpeed {loss:.6f}, plain PyTorch {want:.6f}")
    wrong = any(abs(result[r][3] - result[r][4]) > 1e-5 for r in range(TP))
    print("WRONG: the spec'd embedding lost Gemma3's embed_scale; the loss is not plain PyTorch's" if wrong
          else "the spec'd embedding keeps its scale: the loss is plain PyTorch's")
    sys.exit(1 if wrong else 0)
