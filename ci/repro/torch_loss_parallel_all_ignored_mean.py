"""torch 2.13 loss_parallel(): a mean cross entropy over a batch whose targets are all ignore_index is nan.

The same as plain torch.nn.functional.cross_entropy (0 / 0), so DTensor agrees with unsharded
PyTorch here; it differs from DeepSpeed's vocab_parallel_cross_entropy and the suite's reference,
which define that loss as 0. The gradient is finite (zero) either way, so training is unaffected
unless the nan loss is logged, summed or used for a decision. A cross-framework semantic
difference, kept visible as a known divergence of cases/torch_tp.toml.

Run (CPU, gloo, about 10 s):  python ci/repro/torch_loss_parallel_all_ignored_mean.py
Exit status 1 while loss_parallel returns nan for an all-ignored mean, 0 once it returns a finite value.
"""
import math
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

TP, TOKENS, VOCAB = 2, 6, 10


def rank_main(rank, port, result):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP)
    mesh = DeviceMesh("cpu", list(range(TP)))
    full = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(0)).requires_grad_()
    logits = distribute_tensor(full.detach(), mesh, [Shard(1)]).requires_grad_()
    targets = torch.full((TOKENS,), -100)
    with loss_parallel():
        loss = F.cross_entropy(logits, targets, reduction="mean", ignore_index=-100)
        loss.backward()
    value, grad = float(loss.detach().full_tensor()), logits.grad.full_tensor()  # collectives: every rank
    if rank == 0:
        result["loss"] = value
        result["grad_finite"] = bool(torch.isfinite(grad).all())
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = mp.Manager().dict()
    mp.spawn(rank_main, args=(port, result), nprocs=TP)
    plain = F.cross_entropy(torch.randn(TOKENS, VOCAB), torch.full((TOKENS,), -100), reduction="mean")
    print(f"torch F.cross_entropy (unsharded), all ignored, mean: {float(plain)}")
    print(f"loss_parallel F.cross_entropy,     all ignored, mean: {result['loss']} "
          f"(gradient finite: {result['grad_finite']})")
    print("DeepSpeed vocab_parallel_cross_entropy / the suite's reference: 0.0")
    sys.exit(1 if math.isnan(result["loss"]) else 0)
