"""torch 2.13 DTensor: a rank whose Shard(0)/Shard(-1) piece is empty crashes in _MaskPartial.

DTensor's Shard placement splits as torch.chunk does, so a vocabulary of 4 over 3 ranks is 2, 2, 0:
rank 2 holds no rows. Two ops built on _MaskPartial then fail on that rank, where unsharded torch
computes the same values without complaint:

- loss_parallel's cross entropy: ``_nll_loss_forward`` gathers the (masked, remapped to 0) target
  from an empty class dim: "index 0 is out of bounds for dimension 1 with size 0";
- RowwiseParallel ``nn.Embedding``: the masked ids (remapped to local row 0) index an empty table:
  "index_select(): self indexing axis dim should be positive".

The other ranks then wait in the all-reduce that rank never joins (here gloo reports the closed
connection; the embedding's all-reduce is asynchronous, so its peers only hang when they wait on it). Run (CPU, gloo, about 15 s):  python ci/repro/torch_empty_shard_mask_partial.py
Exit status 1 while the empty-shard rank raises, 0 once both ops run there.

Finding: findings/torch_empty_shard_mask_partial.toml
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN, TOKENS = 3, 4, 5, 6


def attempt(name, fn, rank, result):
    try:
        fn()
        outcome = "ran"
    except Exception as exc:  # noqa: BLE001 - the outcome is what the repro reports
        outcome = f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
    result[f"{name}@{rank}"] = outcome


def rank_main(rank, result, op):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import RowwiseParallel, loss_parallel, parallelize_module

    mesh = DeviceMesh("cpu", list(range(TP)))
    targets = torch.tensor([0, 1, 2, 3, 1, 0])

    def cross_entropy():
        logits = distribute_tensor(torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(0)),
                                   mesh, [Shard(1)])
        with loss_parallel():
            F.cross_entropy(logits, targets)

    def embedding():
        torch.manual_seed(0)
        table = parallelize_module(torch.nn.Embedding(VOCAB, HIDDEN), mesh,
                                   RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
        table(targets)

    attempt(op, {"loss_parallel": cross_entropy, "embedding": embedding}[op], rank, result)
    os._exit(0)  # no teardown: a peer may have left the group mid-collective


if __name__ == "__main__":
    sizes = [len(c) for c in torch.arange(VOCAB).chunk(TP)] + [0] * (TP - len(torch.arange(VOCAB).chunk(TP)))
    print(f"vocab {VOCAB} over {TP} ranks, torch.chunk split: {sizes}")
    result = {}
    for op in ("loss_parallel", "embedding"):
        result.update(run_ranks(rank_main, TP, op))
    logits = torch.randn(TOKENS, VOCAB)
    F.cross_entropy(logits, torch.tensor([0, 1, 2, 3, 1, 0]))
    torch.nn.Embedding(VOCAB, HIDDEN)(torch.tensor([0, 1, 2, 3]))
    print("unsharded torch: cross_entropy and Embedding ran")
    for key in sorted(result.keys()):
        print(f"  {key}: {result[key]}")
    empty = TP - 1
    crashed = [op for op in ("loss_parallel", "embedding") if result[f"{op}@{empty}"].startswith("raised")]
    sys.exit(1 if crashed else 0)
