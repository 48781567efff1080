"""The unsharded reference for a run trained with torch.optim.AdamW instead of SGD: what a user who resumes
training from a checkpoint is owed by plain PyTorch (optimizer.state_dict() / load_state_dict() restore
weights and moments exactly, so a resumed run is the uninterrupted one).

Everything but the optimizer is references/trajectory.py's semantics (data, loss scaling, data-parallel
averaging); the update is torch.optim.AdamW at its defaults except the learning rate, stepping float32
master copies of a bf16/fp16 model (then cast back), as the SGD reference does. No clipping: the cases
that use it set none.
"""
from __future__ import annotations

import torch

from references.tiny_lm import ModelSpec, build_model
from references.trajectory import Trajectory, TrainingSpec, num_items_of, trainer_objective


# torch's default eps (1e-8) turns a gradient entry of any size into a step of about lr. Where an entry's gradient is
# a cancelling sum of rounding size (a bf16 embedding row looked up for the first time, its gradient summed over 4 TP
# shards in another order than the unsharded matmul), its sign is rounding, and two correct runs step it 2 lr apart
# (measured: 0.062 at lr 0.05, tp 2 x dp 2 resumed at tp 4, bf16; the weight bound there is 0.051). An eps above that
# noise keeps such a step proportional to its gradient; the moments still decide every other update.
# 1e-3 was not above it: at vocabulary 2 a bf16 column head's two one-row shards give proj.weight a gradient that is
# the difference of two bf16-rounded partial products (the unsharded matmul cancels them in float32), entries of a
# few 1e-4 with errors of that size; explore seed 0 met one stepped 0.097 away from the reference (bound 0.032, bf16,
# reduction none, hidden 30, tp 2 x dp 2), one seed in nine at its neighbours. At 1e-2 such an entry's step stays
# under a tenth of lr (the same cases pass at seeds 0-4, every uc_ case within 0.37 of its bound).
ADAMW_EPS = 1e-2


def adamw(params, lr: float) -> torch.optim.AdamW:
    """The optimizer both the reference and the subject's user build (one spelling, so they cannot drift)."""
    return torch.optim.AdamW(params, lr=lr, eps=ADAMW_EPS)


def train_adamw_reference(model_spec: ModelSpec, train: TrainingSpec, case_dtype: torch.dtype,
                          compute_dtype: torch.dtype | None = None) -> Trajectory:
    """Weights before and after every step, and every micro-batch's loss, of the uninterrupted run."""
    if train.clip > 0:
        raise ValueError("the AdamW reference models no gradient clipping")
    dtype = compute_dtype or case_dtype
    model = build_model(model_spec, train.seed, case_dtype).to(dtype)
    params = dict(model.named_parameters())
    low_precision = dtype in (torch.bfloat16, torch.float16)
    master_dtype = torch.float32 if low_precision else dtype
    masters = {name: torch.nn.Parameter(p.detach().to(master_dtype).clone()) for name, p in params.items()}
    optimizer = adamw(list(masters.values()), train.lr)
    traj = Trajectory()
    for name, p in params.items():
        traj.put("weight", -1, None, None, name, p)
    for step in range(train.steps):
        step_batches = [train.batches(step, dp_rank, model_spec.vocab, model_spec.ignore_index)
                        for dp_rank in range(train.dp)]
        num_items = num_items_of(step_batches, model_spec.ignore_index)
        step_grads = {name: torch.zeros_like(m) for name, m in masters.items()}
        for dp_rank, batches in enumerate(step_batches):
            model.zero_grad(set_to_none=True)
            for micro, batch in enumerate(batches):
                loss, _ = model(**batch, num_items_in_batch=num_items)
                trainer_objective(loss, train, model_spec.reduction).backward()
                traj.put("loss", step, micro, dp_rank, None, loss)
            for name, p in params.items():
                step_grads[name] += p.grad.to(master_dtype) / train.dp
        for name, m in masters.items():
            m.grad = step_grads[name]
        optimizer.step()
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(masters[name].to(p.dtype))
                traj.put("weight", step, None, None, name, p)
                if low_precision:
                    traj.put("master_weight", step, None, None, name, masters[name])
    return traj
