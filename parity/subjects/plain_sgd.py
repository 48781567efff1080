"""The plain-SGD update of the subjects that train with no engine, as a user of those layers writes it: SGD in
fp32, a recorded float32 master per parameter in bf16/fp16 (docs/subjects.md#plain-sgd)."""
from __future__ import annotations

import torch

from parity.observe.dtypes import DTYPES


class PlainSGD:
    def __init__(self, params: dict[str, torch.nn.Parameter], dtype: torch.dtype, lr: float):
        self.params = params
        self.lr = lr
        self.master = None
        self.optimizer = None
        if self.keeps_masters(dtype):
            self.master = {name: p.detach().float().clone() for name, p in params.items()}
        else:
            self.optimizer = torch.optim.SGD(list(params.values()), lr=lr)

    @staticmethod
    def keeps_masters(dtype: torch.dtype) -> bool:
        """Whether the optimizer for weights of this dtype keeps float32 masters (the subjects ask it
        too: their records_master_weights)."""
        return dtype in (torch.bfloat16, torch.float16)

    def masters(self) -> dict[str, torch.Tensor]:
        """name -> the float32 master after the last step (empty in fp32, which has none)."""
        return dict(self.master or {})

    def step(self, grads: dict[str, torch.Tensor]) -> None:
        """One update. ``grads`` (name -> the float32 step gradient, zeros where p.grad is None) is
        what the master copies step by; torch.optim.SGD reads p.grad itself."""
        with torch.no_grad():
            if self.master is not None:
                for name, p in self.params.items():
                    self.master[name].sub_(self.lr * grads[name])
                    p.copy_(self.master[name].to(p.dtype))
            else:
                self.optimizer.step()


class PlainSGDHead:
    """Mixin first in the bases of a subject that shards the tiny LM itself, one rank per TP index, and trains it
    with PlainSGD: its ranks record the float32 masters where PlainSGD keeps them."""

    def records_master_weights(self, values) -> bool:
        return PlainSGD.keeps_masters(DTYPES[values["dtype"]])

    def world_size(self, values):
        return values["tp"]
