"""Train the unsharded reference and record every quantity a subject is compared on.

Semantics, stated once (the case files refer here). The reference is what a user gets from plain
PyTorch DDP / the Hugging Face Trainer without tensor parallelism (transformers 5.x, trainer.py):
- reduction mean / sum / none: each micro-batch loss (the sum of per-token losses for "none") is
  divided by the gradient-accumulation count before backward (Trainer.training_step: the loss is
  not "scaled for GA", so ``loss / current_gradient_accumulation_steps``; the usual DDP loop alike).
- reduction "num_items": the model's loss is sum / num_items_in_batch, num_items_in_batch being the
  non-ignored shifted targets of the whole optimizer step counted over EVERY data-parallel rank
  (Trainer._get_num_items_in_batch with average_tokens_across_devices=True, its default: gathered
  and summed). The Trainer then multiplies the loss by the data-parallel size (compute_loss:
  ``loss *= num_processes // tp_size``) and does not divide by the accumulation count (the loss is
  already normalised for the step; with DeepSpeed it calls ``backward(..., scale_wrt_gas=False)``).
  With DDP's averaging the step gradient is d(sum of every token loss of the step, all ranks)/N.
  ``step_num_items`` and ``trainer_objective`` say this once; the subjects' training loops (which
  play the user's trainer around the code under test) call them too.
- With data parallelism each replica sees its own batches; the step gradient is the mean over
  replicas of their accumulated gradients (DDP's all-reduce average). With ``comm_dtype`` (bf16 on a
  float32 model) the average is DDP's with torch's bf16_compress_hook
  (torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py, ``_compress_hook(torch.bfloat16, ...)``:
  ``compressed_tensor = buffer.to(dtype).div_(world_size)``, all_reduce in bf16, ``decompressed_tensor.copy_(value)``):
  each replica's accumulated gradient cast to bf16 and divided by the DP size there, summed in bf16 in
  replica order, cast back. The float64 oracle takes no compression: the exact average.
- The optimizer is plain SGD, through float32 master weights when the model is bf16/fp16 (unless the
  training spec says master=False: then SGD steps the low-precision parameters themselves).
- With ``autocast`` (a low-precision dtype) each micro-batch's forward runs under
  ``torch.autocast("cpu", dtype=autocast)`` on the case-dtype (float32) model, backward outside it, as
  a user's AMP loop: nn.Linear in the low dtype (its weight gradient too), cross_entropy upcast to
  float32, float32 gradients averaged across replicas and applied by SGD to float32 weights. The
  float64 oracle takes no autocast: it is the exact computation both are held to.
- With gradient clipping c > 0 the step gradient is scaled by c / (norm + 1e-6) when that is
  below 1, norm being the global L2 norm of the full (unsharded) step gradient, each parameter
  counted once: torch.nn.utils.clip_grad_norm_'s rule. The recorded "grad" is the gradient before
  clipping; "grad_norm" is that norm.
- With ``loss_scale`` (a bf16/fp16 model, or an fp32 model under an fp16 ``autocast``, GradScaler at its
  defaults as a user's fp16 AMP loop has it): torch.amp.GradScaler's dynamic loss scaling
  (references/grad_scaler.py, where the rule and its source are): the objective is multiplied by the
  scale before backward, a step any of whose gradients (on any replica) is inf or nan is skipped (its
  weights and masters stay as they were) and the scale follows GradScaler's update. The records hold
  the unscaled values (head_input_grad and grad divided by the step's scale, exactly: a power of two),
  plus per step "loss_scale" (the scale its backward ran under) and "step_skipped" (1 or 0). The float64
  oracle, where nothing overflows, skips the steps the case-dtype run skipped.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from references.data import count_items, make_batch
from references.grad_scaler import DynamicScaling, ScalerState, any_non_finite
from references.sgd import SGD
from references.tiny_lm import ModelSpec, build_model, capture_head_input_and_grad


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
    # The embedding's padding_idx, placed in every micro-batch's input (references.data.make_batch).
    pad_token: int | None = None
    # False: a bf16/fp16 model stepped by torch.optim.SGD on its own parameters, no float32 copy (what a user who
    # asks for low-precision master weights gets from plain torch); the step applies p.grad as autograd left it.
    master: bool = True
    # Dynamic loss scaling (torch.amp.GradScaler's rule, references/grad_scaler.py); None: no scaling.
    loss_scale: DynamicScaling | None = None
    # The DP gradient average's communication dtype (DDP's bf16_compress_hook for bf16); None: the gradient's own.
    comm_dtype: torch.dtype | None = None

    def batches(self, step: int, dp_rank: int, vocab: int, ignore_index: int) -> list[dict]:
        return [make_batch(self.seed, step, m, dp_rank, batch=self.batch, seq=self.seq, vocab=vocab,
                           ignore=self.ignore, ignore_index=ignore_index, pad_token=self.pad_token)
                for m in range(self.micro_batches)]


@dataclass
class Trajectory:
    """Full (unsharded) float64 copies, keyed (kind, step, micro, dp_rank, name).

    kinds: weight (step -1 is the initial value, step s is after update s), grad (what update s
    used), logits / loss / head_input_grad (per micro-batch and data-parallel rank).
    """
    records: dict = field(default_factory=dict)
    # The same keys -> (dtype, shape) of the tensor as plain torch held it, before the float64 copy:
    # what a subject's tensor at that point must match (parity/checks/contract.py).
    layouts: dict = field(default_factory=dict)
    # kind -> the least precise dtype on the path from the exact inputs to that record, where it is
    # not the case dtype (a loss computed in float32 from exact case-dtype logits). The checks' floor
    # rule (parity/observe/records.py, PATH) reads it; kinds not listed: the case dtype.
    floor_dtypes: dict = field(default_factory=dict)

    def put(self, kind, step, micro, dp_rank, name, tensor):
        key = (kind, step, micro, dp_rank, name)
        # One copy (a float64 tensor's .to would be itself, hence copy=True): the rounding samples
        # (parity/checks/rounding.py) pass every op of a rerun through Python, this one included.
        self.records[key] = tensor.detach().to(torch.float64, copy=True)
        self.layouts[key] = (str(tensor.dtype).replace("torch.", ""), tuple(tensor.shape))

    def get(self, kind, step, micro, dp_rank, name):
        return self.records[(kind, step, micro, dp_rank, name)]


def _scalar(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    return loss.sum() if reduction == "none" else loss


def step_num_items(train: "TrainingSpec", step: int, vocab: int, ignore_index: int) -> int:
    """num_items_in_batch as the HF Trainer passes it by default: the step's non-ignored shifted
    targets over every micro-batch of every data-parallel rank (average_tokens_across_devices=True)."""
    return num_items_of([train.batches(step, dp_rank, vocab, ignore_index) for dp_rank in range(train.dp)],
                        ignore_index)


def num_items_of(step_batches: list, ignore_index: int) -> int:
    """step_num_items of the step's batches already made (step_batches[dp_rank]: that rank's micro-batches)."""
    return sum(count_items(batches, ignore_index) for batches in step_batches)


def trainer_objective(loss: torch.Tensor, train: "TrainingSpec", reduction: str) -> torch.Tensor:
    """The scalar the user's trainer backpropagates for one micro-batch's model loss (module docstring)."""
    scalar = _scalar(loss, reduction)
    if reduction == "num_items":
        return scalar * train.dp  # Trainer.compute_loss; no 1/GAS: the loss is already per step
    return scalar / train.micro_batches


# Records whose every value passed through an autocast op, so their rounding floor is the autocast
# dtype's, not the case dtype's (Trajectory.floor_dtypes). Weights (and grad_norm, from float32 sums of
# the gradients) stay float32 values: what autocast did to them is in the reference's own error, which
# their bound carries; an autocast-dtype floor of 16 u max|w| would hide a wrong update.
AUTOCAST_FLOOR_KINDS = ("logits", "loss", "head_input", "head_input_grad", "grad")


def _tiny_lm_forward(model, batch: dict, num_items: int):
    return model(**batch, num_items_in_batch=num_items)


def train_reference(model_spec: ModelSpec, train: TrainingSpec, case_dtype: torch.dtype,
                    compute_dtype: torch.dtype | None = None, autocast: torch.dtype | None = None,
                    build=None, forward=_tiny_lm_forward, capture=capture_head_input_and_grad) -> Trajectory:
    """Run the reference from the case's initial weights (drawn at ``case_dtype``) in ``compute_dtype``
    (default: the case dtype). float64 gives the oracle: same start, no rounding after it, no autocast.
    ``autocast``: the forward under torch.autocast at that dtype (module docstring). Another model than the
    tiny LM: ``build(case_dtype)`` makes it, ``forward(model, batch, num_items)`` gives (loss, logits) and
    ``capture(model, sink)`` hooks its head's input and that input's gradient."""
    dtype = compute_dtype or case_dtype
    requested_autocast = autocast  # what the oracle's skips are read from
    if dtype == torch.float64:
        autocast = None
    model = (build_model(model_spec, train.seed, case_dtype) if build is None else build(case_dtype)).to(dtype)
    low_precision = dtype in (torch.bfloat16, torch.float16)
    named = dict(model.named_parameters())  # a tied head appears once, under the embedding's name
    # What SGD trains: a frozen parameter (a VLM's vision tower) gets no gradient; its weight is still recorded.
    params = {name: p for name, p in named.items() if p.requires_grad}
    masters = low_precision and train.master
    optimizer = SGD(params, train.lr, torch.float32 if masters else None)
    # The step gradient as the optimizer receives it: float32 beside a float32 master (or in fp32), the parameter's
    # own dtype when SGD steps low-precision parameters directly (torch accumulates micro-batches in p.grad).
    step_dtype = torch.float64 if dtype == torch.float64 else (
        dtype if low_precision and not train.master else torch.float32)
    traj = Trajectory()
    if autocast is not None:
        traj.floor_dtypes.update(dict.fromkeys(AUTOCAST_FLOOR_KINDS, autocast))
    for name, p in named.items():
        traj.put("weight", -1, None, None, name, p)

    captured = {}
    capture(model, captured)

    scaled = train.loss_scale is not None and (low_precision or autocast is not None)
    scaler = ScalerState(train.loss_scale) if scaled else None
    # float64 cannot overflow where fp16 does: the oracle skips what the case-dtype run skipped.
    skips = (oracle_skips(model_spec, train, case_dtype, requested_autocast)
             if train.loss_scale is not None and scaler is None else None)
    for step in range(train.steps):
        scale = scaler.scale if scaler is not None else 1.0
        found_inf = False
        step_grads = {name: torch.zeros_like(p, dtype=step_dtype) for name, p in params.items()}
        # DDP's bf16_compress_hook (module docstring): the replicas' compressed gradients summed in comm_dtype.
        compressed = (None if train.comm_dtype is None or dtype == torch.float64 else
                      {name: torch.zeros_like(p, dtype=train.comm_dtype) for name, p in params.items()})
        # The step's batches, made once (step_num_items would make them again to count their targets).
        step_batches = [train.batches(step, dp_rank, model_spec.vocab, model_spec.ignore_index)
                        for dp_rank in range(train.dp)]
        num_items = num_items_of(step_batches, model_spec.ignore_index)
        for dp_rank, batches in enumerate(step_batches):
            model.zero_grad(set_to_none=True)
            for micro, batch in enumerate(batches):
                with (torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()):
                    loss, logits = forward(model, batch, num_items)
                objective = trainer_objective(loss, train, model_spec.reduction)
                (objective if scaler is None else objective * scale).backward()
                traj.put("logits", step, micro, dp_rank, None, logits)
                traj.put("loss", step, micro, dp_rank, None, loss)
                traj.put("head_input", step, micro, dp_rank, None, captured.pop("x"))
                traj.put("head_input_grad", step, micro, dp_rank, None, captured.pop("h"))
                if scaler is not None:  # unscaled in float64, where dividing by a power of two is exact
                    traj.records[("head_input_grad", step, micro, dp_rank, None)].div_(scale)
            if scaler is not None:
                found_inf = found_inf or any_non_finite(p.grad for p in params.values())
            for name, p in params.items():
                if p.grad is None:  # the loss did not reach it (an expert no token chose): plain SGD leaves it
                    continue
                grad = p.grad.to(step_grads[name].dtype)
                if compressed is not None:
                    compressed[name] += (grad if scaler is None else grad / scale).to(train.comm_dtype).div_(train.dp)
                else:
                    step_grads[name] += (grad if scaler is None else grad / scale) / train.dp
        if compressed is not None:
            step_grads = {name: g.to(step_dtype) for name, g in compressed.items()}
        for name, g in step_grads.items():
            traj.put("grad", step, None, None, name, g)
        if skips is not None:
            found_inf = step in skips
        if train.loss_scale is not None:
            traj.put("loss_scale", step, None, None, None, torch.tensor(scale, dtype=torch.float64))
            traj.put("step_skipped", step, None, None, None, torch.tensor(float(found_inf), dtype=torch.float64))
        if scaler is not None:
            scaler.update(found_inf)
        if train.clip > 0 and not found_inf:
            step_grads = clip_by_global_norm(step_grads, train.clip, traj, step)
        if not found_inf:  # GradScaler.step: no update on a step with an inf or nan gradient
            optimizer.step(step_grads)
        for name, p in named.items():
            traj.put("weight", step, None, None, name, p)
            if optimizer.master is not None and name in params:  # low precision: the float32 copy the next update uses
                traj.put("master_weight", step, None, None, name, optimizer.master[name])
    return traj


def oracle_skips(model_spec: ModelSpec, train: TrainingSpec, case_dtype: torch.dtype, autocast) -> set:
    """The steps the case-dtype reference's GradScaler skipped (its own run, made again here)."""
    run = train_reference(model_spec, train, case_dtype, autocast=autocast)
    return {key[1] for key, value in run.records.items() if key[0] == "step_skipped" and float(value) == 1.0}


def clip_by_global_norm(grads: dict, max_norm: float, traj: Trajectory, step: int) -> dict:
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    traj.put("grad_norm", step, None, None, None, norm)
    coef = max_norm / (float(norm) + 1e-6)
    if coef >= 1:
        return grads
    return {name: g * coef for name, g in grads.items()}
