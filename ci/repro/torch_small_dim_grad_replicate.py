"""torch 2.13 DTensor: a weight sharded on a dimension smaller than the mesh gets a Replicate gradient,
and torch.optim.SGD's step then refuses it.

Found by `parity explore --seed 1` (shrunk to torch_column_gathered, vocabulary 2 over tp 3). A
ColwiseParallel head of 2 output rows over 3 ranks holds 1, 1, 0 rows (torch.chunk's split), forward
and backward run, but the weight's gradient comes back Replicate instead of Shard(0): DTensor does not
shard a dimension smaller than the mesh when it propagates the backward's placements. SGD's in-place
``param.add_(grad, alpha=-lr)`` then raises "aten.add_.Tensor: in-place operations that require
placement changes are not supported" on every rank. A RowwiseParallel head whose hidden size is
smaller than the mesh fails the same way on Shard(1). An empty shard alone is not the trigger: 4 rows
over 3 ranks (2, 2, 0) steps. Unsharded torch steps in every case. Loud, not silent: the training
step raises after forward and backward ran.

Run (CPU, gloo, about 15 s):  python ci/repro/torch_small_dim_grad_replicate.py
Exit status 1 while the step raises for a dimension smaller than the mesh, 0 once it steps.

Finding: findings/torch_small_dim_grad_replicate.toml
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, TOKENS = 3, 6
SHAPES = {"colwise vocab 2": ("colwise", 4, 2), "colwise vocab 4": ("colwise", 4, 4),
          "rowwise hidden 2": ("rowwise", 2, 4)}  # name: (plan, in_features, out_features)


def rank_main(rank, result, name):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.distributed.tensor import Replicate

    plan, fan_in, fan_out = SHAPES[name]
    mesh = DeviceMesh("cpu", list(range(TP)))
    torch.manual_seed(0)
    head = torch.nn.Linear(fan_in, fan_out)
    style = (ColwiseParallel(output_layouts=Replicate()) if plan == "colwise"
             else RowwiseParallel(input_layouts=Replicate()))
    head = parallelize_module(head, mesh, style)
    x = torch.randn(TOKENS, fan_in, generator=torch.Generator().manual_seed(1))
    head(x).float().pow(2).mean().backward()
    placements = (str(head.weight.placements), str(head.weight.grad.placements))
    try:
        torch.optim.SGD(head.parameters(), lr=0.1).step()
        outcome = "stepped"
    except RuntimeError as exc:
        outcome = f"raised RuntimeError: {str(exc).splitlines()[0]}"
    result[f"{name}@{rank}"] = (placements, outcome)


if __name__ == "__main__":
    failed = False
    for name, (plan, fan_in, fan_out) in SHAPES.items():
        got = run_ranks(rank_main, TP, name)
        (weight, grad), outcome = got[f"{name}@0"]
        print(f"{name} over {TP} ranks ({plan}, Linear({fan_in}, {fan_out})): weight {weight}, grad {grad}: {outcome}")
        sharded_dim = fan_in if plan == "rowwise" else fan_out
        failed |= sharded_dim < TP and outcome != "stepped"
        plain = torch.nn.Linear(fan_in, fan_out)
        plain(torch.randn(TOKENS, fan_in)).pow(2).mean().backward()
        torch.optim.SGD(plain.parameters(), lr=0.1).step()
    print("unsharded torch: every step ran")
    sys.exit(1 if failed else 0)
