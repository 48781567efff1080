"""What a user's model looks like, as plain data: for checking that a refused setup left it untouched.

A rejection (deepspeed.initialize raising) is only clean if the model the user still holds is the
model they passed: a model whose head was swapped for a sharded layer before the error can be
trained on, silently, as a half-converted one. A snapshot records, per module path, the class; per
parameter (ties included, so an untied or re-tied weight shows), its shape, dtype, requires_grad
and a digest of its bytes; and any extra plain values the caller names (process-global switches,
attributes such as ``loss_function``). Two snapshots are compared by parity.checks.compare.
"""
from __future__ import annotations

import hashlib

import torch


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's bytes (any dtype: viewed as uint8), so equal values give equal digests."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def model_state(model: torch.nn.Module, **extra) -> dict:
    """{"module[path]": class name, "param[name]": (shape, dtype, requires_grad, digest),
    "tie[name]": the first name of the same Parameter, **{"extra[key]": repr(value)}}."""
    state = {f"module[{path or '<root>'}]": type(m).__name__ for path, m in model.named_modules()}
    for path, m in model.named_modules():
        # A refused engine that registered its hooks on the model before raising leaves them behind: the
        # user's next forward runs them (ci/repro/deepspeed_rejected_initialize_converts_model.py).
        hooks = sorted(_hook_name(h) for table in (m._forward_pre_hooks, m._forward_hooks, m._backward_pre_hooks,
                                                   m._backward_hooks) for h in table.values())
        if hooks:
            state[f"hooks[{path or '<root>'}]"] = hooks
    first_name = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        state[f"param[{name}]"] = (tuple(p.shape), str(p.dtype).replace("torch.", ""), bool(p.requires_grad),
                                   tensor_digest(p))
        state[f"tie[{name}]"] = first_name.setdefault(id(p), name)
    for key, value in extra.items():
        state[f"extra[{key}]"] = repr(value)
    return state


def _hook_name(hook) -> str:
    """A hook's qualified name (a bound method's function's), stable across processes."""
    func = getattr(hook, "__func__", hook)
    return getattr(func, "__qualname__", type(hook).__name__)


def loss_function_repr(model: torch.nn.Module) -> str:
    """What ``model.loss_function`` is (a class name), or that it is absent: the engine replaces it."""
    try:
        value = model.loss_function
    except AttributeError:
        return "<absent>"
    return "None" if value is None else type(value).__name__
