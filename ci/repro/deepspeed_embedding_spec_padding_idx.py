"""DeepSpeed 0.19.8: an untied nn.Embedding matched by a partition_config spec loses its padding_idx.

A user shards the input embedding too: `partition_config` specs `embed_tokens.weight` (row) and the
next Linear `proj.weight` (row), embedding built with `padding_idx=0`. `AutoTP._slice_embedding`
(module_inject/auto_tp.py:886-929) rebuilds it as a bare `nn.Embedding(V, H/P)`: `padding_idx` (and
max_norm, scale_grad_by_freq, sparse) are dropped, and the slice is never marked model-parallel. In
plain PyTorch the padding row gets a zero gradient and never moves; under DeepSpeed it gets the
gradient of every padding lookup and trains, with no warning. (The missing model-parallel mark also
makes the clipping norm count the slice on TP rank 0 only; not measured here.)

Run (CPU, about 15 s):  python ci/repro/deepspeed_embedding_spec_padding_idx.py
Exit status 1 while the padding row gets a gradient, 0 once it stays zero (or the spec is refused).

Finding: findings/deepspeed_embedding_spec_bare_rebuild.toml
"""
import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN, PAD = 2, 35, 32, 0


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN, padding_idx=PAD)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    plain = copy.deepcopy(model)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"embed_tokens\.weight$"], "partition_type": "row"},
                  {"patterns": [r"proj\.weight$"], "partition_type": "row"},
                  {"patterns": [r"lm_head\.weight$"], "partition_type": "skip"}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    ids = torch.tensor([[PAD, 3, PAD, 7, 9, PAD, 11, 2], [5, PAD, PAD, 1, 4, 6, PAD, 8]])
    loss = engine(ids)
    engine.backward(loss)
    plain(ids).backward()
    embedding = model.embed_tokens
    result[rank] = (embedding.padding_idx, float(embedding.weight.grad[PAD].abs().max()),
                    float(plain.embed_tokens.weight.grad[PAD].abs().max()))


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    for rank in range(TP):
        padding_idx, ds, torch_grad = result[rank]
        print(f"rank {rank}: embedding padding_idx after initialize = {padding_idx}; max |grad of padding row| "
              f"DeepSpeed {ds:.3e}, plain PyTorch {torch_grad:.3e}")
    wrong = any(result[r][1] != 0 for r in range(TP))
    print("WRONG: the padding row gets a gradient" if wrong else "padding row gradient is zero, as in PyTorch")
    sys.exit(1 if wrong else 0)
