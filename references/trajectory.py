"""Train the unsharded reference and record every quantity a subject is compared on.

Semantics, stated once (the case files refer here):
- Each micro-batch loss is divided by the gradient-accumulation count before backward (DeepSpeed's
  engine does this), so gradients into the head input are d(loss/GAS)/dh.
- reduction "none" backpropagates the sum of per-token losses; "num_items" divides the sum by the
  number of non-ignored targets in the whole optimizer step on that data-parallel rank.
- With data parallelism each replica sees its own batches; the step gradient is the mean over
  replicas of their accumulated gradients.
- The optimizer is plain SGD, through float32 master weights when the model is bf16/fp16.
- With gradient clipping c > 0 the step gradient is scaled by c / (norm + 1e-6) when that is
  below 1, norm being the global L2 norm of the full (unsharded) step gradient, each parameter
  counted once: torch.nn.utils.clip_grad_norm_'s rule. The recorded "grad" is the gradient before
  clipping; "grad_norm" is that norm.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from references.data import count_items, make_batch
from references.sgd import SGD
from references.tiny_lm import ModelSpec, build_model, capture_head_input_grad


@dataclass(frozen=True)
class TrainingSpec:
    seed: int = 1234
    steps: int = 5
    micro_batches: int = 2
    batch: int = 2
    seq: int = 6
    lr: float = 0.05
    ignore: str = "scattered"
    dp: int = 1
    clip: float = 0.0

    def batches(self, step: int, dp_rank: int, vocab: int, ignore_index: int) -> list[dict]:
        return [make_batch(self.seed, step, m, dp_rank, batch=self.batch, seq=self.seq, vocab=vocab,
                           ignore=self.ignore, ignore_index=ignore_index) for m in range(self.micro_batches)]


@dataclass
class Trajectory:
    """Full (unsharded) float64 copies, keyed (kind, step, micro, dp_rank, name).

    kinds: weight (step -1 is the initial value, step s is after update s), grad (what update s
    used), logits / loss / head_input_grad (per micro-batch and data-parallel rank).
    """
    records: dict = field(default_factory=dict)
    # kind -> the least precise dtype on the path from the exact inputs to that record, where it is
    # not the case dtype (a loss computed in float32 from exact case-dtype logits): what a
    # tolerance's rounding floor is measured in. Kinds not listed: the case dtype.
    floor_dtypes: dict = field(default_factory=dict)

    def put(self, kind, step, micro, dp_rank, name, tensor):
        self.records[(kind, step, micro, dp_rank, name)] = tensor.detach().to(torch.float64).clone()

    def get(self, kind, step, micro, dp_rank, name):
        return self.records[(kind, step, micro, dp_rank, name)]


def _scalar(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    return loss.sum() if reduction == "none" else loss


def train_reference(model_spec: ModelSpec, train: TrainingSpec, case_dtype: torch.dtype,
                    compute_dtype: torch.dtype | None = None) -> Trajectory:
    """Run the reference from the case's initial weights (drawn at ``case_dtype``) in ``compute_dtype``
    (default: the case dtype). float64 gives the oracle: same start, no rounding after it."""
    dtype = compute_dtype or case_dtype
    model = build_model(model_spec, train.seed, case_dtype).to(dtype)
    low_precision = dtype in (torch.bfloat16, torch.float16)
    params = dict(model.named_parameters())  # a tied head appears once, under the embedding's name
    optimizer = SGD(params, train.lr, torch.float32 if low_precision else None)
    traj = Trajectory()
    for name, p in params.items():
        traj.put("weight", -1, None, None, name, p)

    captured = {}
    capture_head_input_grad(model, captured)

    for step in range(train.steps):
        step_grads = {name: torch.zeros_like(p, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
                      for name, p in params.items()}
        for dp_rank in range(train.dp):
            model.zero_grad(set_to_none=True)
            batches = train.batches(step, dp_rank, model_spec.vocab, model_spec.ignore_index)
            num_items = count_items(batches, model_spec.ignore_index)
            for micro, batch in enumerate(batches):
                loss, logits = model(**batch, num_items_in_batch=num_items)
                (_scalar(loss, model_spec.reduction) / train.micro_batches).backward()
                traj.put("logits", step, micro, dp_rank, None, logits)
                traj.put("loss", step, micro, dp_rank, None, loss)
                traj.put("head_input_grad", step, micro, dp_rank, None, captured.pop("h"))
            for name, p in params.items():
                step_grads[name] += p.grad.to(step_grads[name].dtype) / train.dp
        for name, g in step_grads.items():
            traj.put("grad", step, None, None, name, g)
        if train.clip > 0:
            step_grads = clip_by_global_norm(step_grads, train.clip, traj, step)
        optimizer.step(step_grads)
        for name, p in params.items():
            traj.put("weight", step, None, None, name, p)
    return traj


def clip_by_global_norm(grads: dict, max_norm: float, traj: Trajectory, step: int) -> dict:
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    traj.put("grad_norm", step, None, None, None, norm)
    coef = max_norm / (float(norm) + 1e-6)
    if coef >= 1:
        return grads
    return {name: g * coef for name, g in grads.items()}
