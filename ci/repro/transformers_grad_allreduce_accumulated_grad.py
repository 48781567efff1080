"""transformers 5.24 tensor parallelism: replicated_with_grad_allreduce all-reduces the accumulated .grad after every
backward, so with gradient accumulation each earlier micro-batch's gradient is summed over the ranks again.

Found by cases/zoo_transformers_tp.toml (qwen3 and gemma3: their per-head q_norm / k_norm are planned
``replicated_with_grad_allreduce``; 2 micro-batches per step). ReplicatedWithGradAllReduce.install_forward
(transformers/distributed/tensor_parallel.py) registers ``register_post_accumulate_grad_hook(_all_reduce_grad)``,
which runs ``dist.all_reduce(param.grad)`` on the parameter's whole .grad each time a backward accumulates into it.
After micro-batch 1 .grad is the sum over ranks S1; micro-batch 2 adds its rank-local part and the hook sums the
whole again: tp * S1 + S2 instead of S1 + S2. With one micro-batch per step (or an optimizer step and zero_grad
after every backward) it is right. Silent: no error, the norm weights train on a wrong gradient.

Here a module of one replicated weight w, each rank's input its own (as each rank's heads), y = sum(x * w): the
gradient of the sum of both ranks' outputs is the sum of their inputs; the style is transformers' own, from
ALL_PARALLEL_STYLES, on a 2-rank gloo mesh.

Run (CPU, gloo, about 20 s):  python ci/repro/transformers_grad_allreduce_accumulated_grad.py
Exit status 1 while the accumulated gradient is all-reduced again, 0 once it is right.

Finding: findings/transformers_grad_allreduce_accumulated_grad.toml
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, WIDTH = 2, 4


def inputs(rank: int, micro: int) -> torch.Tensor:
    return torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(100 * micro + rank))


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(WIDTH))

    def forward(self, x):
        return x * self.weight


def rank_main(rank, result, micro_batches):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES

    mesh = init_device_mesh("cpu", (TP,))
    module = ALL_PARALLEL_STYLES["replicated_with_grad_allreduce"].install_forward(Scale(), mesh)
    for micro in range(micro_batches):
        module(inputs(rank, micro)).sum().backward()
    result[rank] = module.weight.grad.tolist()


if __name__ == "__main__":
    failed = False
    for micro_batches in (1, 2):
        got = torch.tensor(run_ranks(rank_main, TP, micro_batches)[0])
        want = sum(inputs(r, m).sum(0) for r in range(TP) for m in range(micro_batches))  # d/dw of every output
        first = sum(inputs(r, 0).sum(0) for r in range(TP))
        ok = torch.allclose(got, want, atol=1e-5)
        note = "" if ok else (f"; (tp - 1) x the first micro-batch's summed gradient too: "
                              f"{torch.allclose(got, want + (TP - 1) * first, atol=1e-5)}")
        print(f"{micro_batches} micro-batch(es), tp {TP}: grad {[round(v, 4) for v in got.tolist()]}, "
              f"expected {[round(v, 4) for v in want.tolist()]}: {'right' if ok else 'WRONG'}{note}")
        failed |= not ok
    sys.exit(1 if failed else 0)
