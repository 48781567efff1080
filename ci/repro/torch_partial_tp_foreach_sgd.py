"""torch.optim.SGD's foreach step refuses a model tensor-parallelized only in part (its head).

A user who applies a DTensor plan to the output head alone (the embedding and the body stay plain
tensors) and trains with the default torch.optim.SGD gets, on CUDA, where SGD defaults to its foreach
implementation:

    RuntimeError: aten._foreach_add_.List: got mixed torch.Tensor and DTensor, ...

The foreach kernel groups parameters by device and dtype, not by tensor subclass, so one list mixes
DTensor and plain parameters. On CPU SGD defaults to the per-parameter loop, which works; the same
model unsharded trains on both. This script shows it on CPU by asking for foreach=True, which is
what CUDA chooses by default (torch.optim.optimizer._default_to_fused_or_foreach). Seen on the H200
with torch 2.11 (results/h200-dtensor/), reproduced here with the installed torch.

Run (CPU, gloo, one process, a few seconds):  python ci/repro/torch_partial_tp_foreach_sgd.py
Exit status 1 while the foreach step raises on a partly parallelized model, 0 once it trains.

Finding: findings/torch_partial_tp_foreach_sgd.toml
"""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import init_gloo  # noqa: E402


def main() -> int:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    init_gloo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))
    plain = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))
    plain.load_state_dict(model.state_dict())
    parallelize_module(model, DeviceMesh("cpu", [0]), {"1": ColwiseParallel()})
    ids = torch.tensor([[1, 2, 3]])
    for m in (plain, model):
        m(ids).float().pow(2).mean().backward()
    torch.optim.SGD(plain.parameters(), lr=0.1, foreach=True).step()
    print("unsharded model, SGD(foreach=True): step ok")
    torch.optim.SGD(model.parameters(), lr=0.1, foreach=False).step()
    print("head-only DTensor plan, SGD(foreach=False) (CPU's default): step ok")
    try:
        torch.optim.SGD(model.parameters(), lr=0.1, foreach=True).step()
    except RuntimeError as exc:
        print(f"head-only DTensor plan, SGD(foreach=True) (CUDA's default): {str(exc).splitlines()[0][:160]}")
        return 1
    finally:
        dist.destroy_process_group()
    print("head-only DTensor plan, SGD(foreach=True): step ok (fixed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
