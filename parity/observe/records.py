"""The record schema: every kind of tensor a subject records (RankObservations.record) and the
reference holds (references.trajectory.Trajectory), declared once.

Each kind says what it is, whether it is taken per micro-batch or per optimizer step, the dtype
the plain-torch reference holds it in (the dtype contract parity/checks/contract.py holds each
subject's tensor to), how a rank holds it end to end (FULL: the whole tensor; BLOCK: possibly its
block of the suite's partition) and the dtype its bound's rounding floor is measured in
(parity/checks/tolerances.py). A kind with a stage-local check (parity/checks/stages.py, the
checks named ``...[stage]``) has a second entry in STAGES, of mode STAGE, with that check's floor.
The checks read mode and floor from here (record_kind), never from a check's name.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.observe.dtypes import DTYPES

MICRO, STEP = "micro-batch", "step"
FULL, BLOCK, STAGE = "full", "local block", "stage-local"

# Dtype contracts: the dtype of the reference's own tensor, from the case's dtype and autocast.
CASE = "case"  # the case (model) dtype
COMPUTE = "compute"  # the dtype the op ran in: the autocast dtype under autocast, else the case dtype
FLOAT32 = "float32"
FLOAT64 = "float64"
STEP_GRAD = "step_grad"  # float32 beside a float32 master (or in fp32); the case dtype with no master

# Floor rules: the dtype a bound's rounding floor is measured in.
PATH = "path"  # the least precise dtype on the reference's path to it (Trajectory.floor_dtypes), else the case dtype
FLOOR_CASE = "case"  # the case dtype: a float32 value under autocast keeps the float32 floor
FLOOR_FLOAT32 = "float32"  # a stage computed in float32 whatever the case dtype (the CE from upcast logits)
FLOOR_STAGE = "stage"  # the stage's compute dtype: the autocast dtype under autocast, else the case dtype


@dataclass(frozen=True)
class RecordKind:
    name: str
    what: str
    per: str  # MICRO or STEP
    dtype: str  # the dtype contract (CASE, COMPUTE, FLOAT32, FLOAT64, STEP_GRAD)
    mode: str  # FULL, BLOCK or STAGE
    floor: str  # PATH, FLOOR_CASE, FLOOR_FLOAT32 or FLOOR_STAGE
    oracle: str | None = None  # the float64 oracle's kind it is held against, where not its own

    def reference_dtype(self, case: str, autocast: str = "off", master: bool = True) -> torch.dtype:
        """The dtype the plain-torch reference holds this record in, for a case of dtype ``case``."""
        low = case in ("bf16", "fp16")
        return {CASE: DTYPES[case], FLOAT32: torch.float32, FLOAT64: torch.float64,
                COMPUTE: DTYPES[case if autocast == "off" else autocast],
                STEP_GRAD: DTYPES[case] if low and not master else torch.float32}[self.dtype]

    def floor_dtype(self, case: str, stage_dtype: str, path: dict):
        """The dtype this check's rounding floor is measured in. ``case``: the case dtype's name;
        ``stage_dtype``: the stages' compute dtype's; ``path``: the reference's Trajectory.floor_dtypes."""
        if self.floor == PATH:
            return path.get(self.name, case)
        return {FLOOR_CASE: case, FLOOR_FLOAT32: torch.float32, FLOOR_STAGE: stage_dtype}[self.floor]


def _kinds(*kinds: RecordKind) -> dict:
    return {k.name: k for k in kinds}


RECORDS = _kinds(
    # a training head (references/trajectory.py)
    RecordKind("logits", "the head's output for one micro-batch", MICRO, COMPUTE, BLOCK, PATH),
    RecordKind("loss", "the model's loss for one micro-batch (per token with reduction none)", MICRO, FLOAT32,
               FULL, PATH),
    RecordKind("head_input", "the hidden state the head receives (a stage input)", MICRO, COMPUTE, FULL, PATH),
    RecordKind("head_input_grad", "the loss's gradient at the head's input", MICRO, COMPUTE, FULL, PATH),
    RecordKind("grad", "a parameter's step gradient as the update uses it, before clipping", STEP, STEP_GRAD,
               BLOCK, PATH),
    RecordKind("weight", "a parameter after update s (step -1: the initial value)", STEP, CASE, BLOCK, FLOOR_CASE),
    # The oracle has no master: its weights are the exact values a master approximates.
    RecordKind("master_weight", "the optimizer's float32 copy of a bf16/fp16 parameter after update s", STEP,
               FLOAT32, BLOCK, FLOOR_CASE, oracle="weight"),
    RecordKind("grad_norm", "the global L2 norm of the step gradient, before clipping", STEP, FLOAT64, FULL,
               FLOOR_CASE),
    RecordKind("loss_scale", "the dynamic loss scale a step's backward ran under (reference only)", STEP, FLOAT64,
               FULL, FLOOR_CASE),
    RecordKind("step_skipped", "1 where GradScaler skipped the step, else 0 (reference only)", STEP, FLOAT64, FULL,
               FLOOR_CASE),
    # an embedding trained alone (references/embedding_lookup.py)
    RecordKind("embedding", "an embedding lookup's output for one micro-batch", MICRO, CASE, FULL, PATH),
    # a cross entropy on given logits (references/cross_entropy.py ce_reference)
    RecordKind("logits_grad", "the loss's gradient at the given logits", MICRO, CASE, BLOCK, PATH),
    RecordKind("logits_hvp", "a Hessian-vector product at the given logits (create_graph)", MICRO, CASE, BLOCK,
               PATH),
    RecordKind("logits_after", "the given logits after the call (compared bitwise: untouched)", MICRO, CASE,
               BLOCK, PATH),
    # a fused linear + cross entropy (references/cross_entropy.py linear_ce_reference)
    RecordKind("hidden_grad", "the loss's gradient at the hidden state", MICRO, CASE, BLOCK, PATH),
    RecordKind("weight_grad", "the loss's gradient at the head weight", MICRO, CASE, BLOCK, PATH),
    RecordKind("bias_grad", "the loss's gradient at the head bias", MICRO, CASE, BLOCK, PATH),
    # a KL divergence between two given logits (references/kl_div.py)
    RecordKind("student_grad", "the KL's gradient at the student logits", MICRO, CASE, BLOCK, PATH),
    RecordKind("teacher_grad", "the KL's gradient at the teacher logits", MICRO, CASE, BLOCK, PATH),
    RecordKind("student_after", "the student logits after the call (compared bitwise)", MICRO, CASE, BLOCK, PATH),
    RecordKind("teacher_after", "the teacher logits after the call (compared bitwise)", MICRO, CASE, BLOCK, PATH),
)

# The stage-local checks (``<kind>[stage]``, parity/checks/compare.py check_stages): each recomputed from
# the subject's own recorded inputs to the stage, so nothing upstream is inherited.
STAGES = _kinds(
    RecordKind("loss", "the loss from the subject's own logits (or lookup)", MICRO, FLOAT32, STAGE,
               FLOOR_FLOAT32),  # the CE (and the lookup loss) computes in float32 from its inputs
    RecordKind("head_input_grad", "dz W from the subject's own logits and head weight", MICRO, COMPUTE, STAGE,
               FLOOR_STAGE),
    RecordKind("logits", "F.linear of the subject's own head input, weight and bias", MICRO, COMPUTE, STAGE,
               FLOOR_STAGE),
    RecordKind("grad", "the head's step gradient, sum of dz^T x over its micro-batches", STEP, STEP_GRAD, STAGE,
               FLOOR_STAGE),
)


def record_kind(name: str, stage: bool = False) -> RecordKind:
    """The schema entry of a record kind (of its stage-local check with ``stage``)."""
    table = STAGES if stage else RECORDS
    if name not in table:
        raise ValueError(f"record kind {name!r} has no {'stage-local check' if stage else 'entry'} in the record "
                       f"schema (parity/observe/records.py); known: {', '.join(sorted(table))}")
    return table[name]
