"""DeepSpeed 0.19.8: an untied nn.Embedding matched by a partition_config spec loses scale_grad_by_freq and max_norm.

The same path as deepspeed_embedding_spec_padding_idx.py: `partition_config` specs `embed_tokens.weight` (row) and
the next Linear `proj.weight` (row). `AutoTP._slice_embedding` (module_inject/auto_tp.py:886-929) rebuilds the
embedding as a bare `nn.Embedding(V, H/P)`, and nothing says the options are gone:

- scale_grad_by_freq=True: plain PyTorch divides each lookup's gradient by its id's count in the batch; after
  initialize the slice has scale_grad_by_freq False, so a row looked up k times gets k times torch's gradient.
  (Every rank looks every id up, so the slice could keep the option exactly.)
- max_norm=1.0: plain PyTorch renormalises every looked-up row longer than 1 to norm 1, in place, on lookup; after
  initialize the slice has max_norm None, so the rows keep their norm (about sqrt(hidden) at nn.Embedding's init)
  and every output differs from the first forward. (A slice alone could not compute the row norm either.)

Run (CPU, about 20 s):  python ci/repro/deepspeed_embedding_spec_drops_grad_options.py
Exit status 1 while either option is dropped (or its numbers differ), 0 once both match PyTorch (or the spec is refused).

Finding: findings/deepspeed_embedding_spec_bare_rebuild.toml
"""
import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 35, 32
# Token 3 occurs three times in the first row, token 7 twice in the second: their counts are what
# scale_grad_by_freq divides by.
IDS = torch.tensor([[3, 5, 3, 9, 3, 11, 2, 4], [7, 1, 7, 6, 8, 10, 12, 13]])


class Tiny(torch.nn.Module):
    def __init__(self, **embedding_options):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN, **embedding_options)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def hidden_slice(rank, full):
    width = HIDDEN // TP
    return full[:, rank * width:(rank + 1) * width]


def run_one(rank, options):
    """The loss and the embedding's gradient and weight after one forward/backward, DeepSpeed's slice against plain
    PyTorch's matching columns; and the options the embedding holds after initialize."""
    import deepspeed

    torch.manual_seed(0)
    model = Tiny(**options)
    plain = copy.deepcopy(model)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"embed_tokens\.weight$"], "partition_type": "row"},
                  {"patterns": [r"proj\.weight$"], "partition_type": "row"},
                  {"patterns": [r"lm_head\.weight$"], "partition_type": "skip"}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    loss = engine(IDS)
    engine.backward(loss)
    plain_loss = plain(IDS)
    plain_loss.backward()
    embedding = model.embed_tokens
    grad_diff = float((embedding.weight.grad - hidden_slice(rank, plain.embed_tokens.weight.grad)).abs().max())
    weight_diff = float((embedding.weight.detach() - hidden_slice(rank, plain.embed_tokens.weight.detach())).abs().max())
    return {"kept": (embedding.scale_grad_by_freq, embedding.max_norm), "loss": (loss.item(), plain_loss.item()),
            "grad_diff": grad_diff, "weight_diff": weight_diff,
            "row3_grad_ratio": float(embedding.weight.grad[3].norm() / hidden_slice(rank, plain.embed_tokens.weight.grad)[3].norm()),
            "row3_norm": (float(embedding.weight.detach()[3].norm()),
                          float(hidden_slice(rank, plain.embed_tokens.weight.detach())[3].norm()))}


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result[rank] = {"scale_grad_by_freq": run_one(rank, {"scale_grad_by_freq": True}),
                    "max_norm": run_one(rank, {"max_norm": 1.0})}


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    wrong = False
    for option in ("scale_grad_by_freq", "max_norm"):
        print(f"{option}:")
        for rank in range(TP):
            r = result[rank][option]
            sgbf, max_norm = r["kept"]
            print(f"  rank {rank}: after initialize scale_grad_by_freq={sgbf}, max_norm={max_norm}; loss DeepSpeed "
                  f"{r['loss'][0]:.6f} vs PyTorch {r['loss'][1]:.6f}; max |grad diff| {r['grad_diff']:.3e}; "
                  f"max |weight diff| after the forward {r['weight_diff']:.3e}; row 3 (looked up 3 times): grad "
                  f"norm ratio {r['row3_grad_ratio']:.3f}, slice norm DeepSpeed {r['row3_norm'][0]:.3f} vs "
                  f"PyTorch {r['row3_norm'][1]:.3f}")
            wrong = wrong or r["grad_diff"] > 1e-5 or r["weight_diff"] > 1e-6 or abs(r["loss"][0] - r["loss"][1]) > 1e-5
    print("WRONG: the spec'd embedding's options are dropped, numbers differ from PyTorch" if wrong
          else "both options kept: the spec'd embedding matches PyTorch")
    sys.exit(1 if wrong else 0)
