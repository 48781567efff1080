"""Plain SGD (no momentum, no weight decay, no clipping), optionally through fp32 master weights.

Mixed precision: the model holds low-precision weights, the optimizer a float32 master copy; the
update is applied to the master, then cast back. The choice and its source: this is the update a
user without TP gets from the HF Trainer's bf16/fp16 (torch.autocast over float32 parameters: the
optimizer steps float32 weights, the matmuls run on their low-precision casts) and from apex/
Micikevicius et al.'s mixed-precision recipe; a pure-bf16 torch.optim.SGD on bf16 parameters would
round every update to bf16 instead. (DeepSpeed's bf16/fp16 optimizers happen to do the same.)
"""
from __future__ import annotations

import torch


class SGD:
    def __init__(self, params: dict[str, torch.nn.Parameter], lr: float, master_dtype: torch.dtype | None):
        self.params = params
        self.lr = lr
        self.master = None
        if master_dtype is not None:
            self.master = {name: p.detach().to(master_dtype).clone() for name, p in params.items()}

    @torch.no_grad()
    def step(self, grads: dict[str, torch.Tensor]) -> None:
        for name, p in self.params.items():
            if self.master is None and p.dtype in (torch.bfloat16, torch.float16):
                # torch.optim.SGD on a low-precision parameter: p + (-lr) * g evaluated in float32, rounded once.
                p.add_(grads[name].to(p.dtype), alpha=-self.lr)
            elif self.master is None:
                p.sub_(self.lr * grads[name].to(p.dtype))
            else:
                master = self.master[name]
                master.sub_(self.lr * grads[name].to(master.dtype))
                p.copy_(master.to(p.dtype))
