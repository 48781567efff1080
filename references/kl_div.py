"""Reference for the vocabulary-parallel KL divergence: per-token KL between the softmaxes of a student's
and a teacher's full-vocabulary logits, and its gradients to both.

What a user without tensor parallelism writes (upcast to float32 first, as token_losses does):

    log_s = F.log_softmax(student.float(), dim=-1)
    log_t = F.log_softmax(teacher.float(), dim=-1)
    forward = F.kl_div(log_s, log_t, log_target=True, reduction="none").sum(-1)   # KL(teacher || student)
    reverse = F.kl_div(log_t, log_s, log_target=True, reduction="none").sum(-1)   # KL(student || teacher)

one value per token (the "per-token sum form"; its mean over tokens is F.kl_div's reduction="batchmean"
on [tokens, vocab], not its default "mean", which also divides by the vocabulary). DeepSpeed's
vocab_parallel_kl_div documents exactly this: "Per-token KL divergence ..., in fp32", forward by default,
reduction left to the caller. Computed here from the definition, sum_i p_a,i (log p_a,i - log p_b,i);
tests/references check it against F.kl_div.

The upstream gradient is a fixed positive weight per token, so a subject that ignores grad_output, or
applies it to the wrong token, is caught.
"""
from __future__ import annotations

import torch

from references.seeding import exact_inputs
from references.trajectory import Trajectory

KL_GRADS = ("student", "teacher", "both")
KL_INF_ROWS = ("none", "all", "masked")


def _mask(student: torch.Tensor, teacher: torch.Tensor, inf_rows: str) -> None:
    """inf_rows "all": rows whose logits are all -inf (a fully masked position): the student's row 1, the
    teacher's row 2, both at row 3. "masked": some ids masked to -inf (a masked vocabulary, as top-k/top-p or
    a constrained decoder leaves it): the teacher's ids 0 and V-1 at row 4 (the student keeps them), the same
    ids 1 and V//2 in both at row 5, the student's ids 2 and V-2 at row 6 (the teacher keeps them); ids on the
    first and the last TP rank's shards."""
    if inf_rows not in KL_INF_ROWS:
        raise ValueError(f"inf_rows must be one of {KL_INF_ROWS}, got {inf_rows!r}")
    vocab, inf = student.shape[-1], float("-inf")
    if inf_rows == "all":
        student[1] = inf
        teacher[2] = inf
        student[3] = teacher[3] = inf
    elif inf_rows == "masked":
        teacher[4, [0, vocab - 1]] = inf
        student[5, [1, vocab // 2]] = teacher[5, [1, vocab // 2]] = inf
        student[6, [2, vocab - 2]] = inf


def kl_inputs(seed: int, tokens: int, vocab: int, dtype: torch.dtype, inf_rows: str = "none"):
    """Student logits, teacher logits (the student's plus noise: a teacher the student partly agrees with),
    and a positive per-token upstream weight. Drawn in float32 and cast to ``dtype`` once; then the -inf
    entries of ``inf_rows`` (_mask), the other values as drawn."""
    with exact_inputs():
        gen = torch.Generator().manual_seed(seed)
        student = 3 * torch.randn(tokens, vocab, generator=gen)
        teacher = student + 2 * torch.randn(tokens, vocab, generator=gen)
        upstream = torch.rand(tokens, generator=gen) + 0.5
    student, teacher = student.to(dtype), teacher.to(dtype)
    _mask(student, teacher, inf_rows)
    return student, teacher, upstream


def token_kl(student: torch.Tensor, teacher: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Per-token KL(teacher || student) (reverse: KL(student || teacher)) over the whole vocabulary,
    upcast to float32 (float64 stays float64)."""
    s = student if student.dtype == torch.float64 else student.float()
    t = teacher if teacher.dtype == torch.float64 else teacher.float()
    log_s = s - s.logsumexp(dim=-1, keepdim=True)
    log_t = t - t.logsumexp(dim=-1, keepdim=True)
    a, b = (log_s, log_t) if reverse else (log_t, log_s)
    return (a.exp() * (a - b)).sum(dim=-1)


def kl_reference(seed: int, tokens: int, vocab: int, reverse: bool, grad: str, case_dtype: torch.dtype,
                 compute_dtype: torch.dtype | None = None, inf_rows: str = "none") -> Trajectory:
    """loss: the per-token KL; student_grad / teacher_grad for the logits that require grad (``grad``);
    student_after / teacher_after: the inputs as they were before the call. With -inf entries (inf_rows) the
    numbers are F.kl_div's: nan where a row has no softmax, and where exp(-inf) * (-inf - x) is 0 * -inf (an
    id the weighting side masks); +inf where only the other side masks an id."""
    if grad not in KL_GRADS:
        raise ValueError(f"grad must be one of {KL_GRADS}, got {grad!r}")
    student, teacher, upstream = kl_inputs(seed, tokens, vocab, case_dtype, inf_rows)
    dtype = compute_dtype or case_dtype
    s = student.to(dtype).requires_grad_(grad in ("student", "both"))
    t = teacher.to(dtype).requires_grad_(grad in ("teacher", "both"))
    loss = token_kl(s, t, reverse)
    (loss * upstream.to(loss.dtype)).sum().backward()
    traj = Trajectory()
    traj.put("loss", 0, 0, 0, None, loss)
    traj.floor_dtypes["loss"] = loss.dtype  # float32 (upcast) from the exact input logits
    if s.requires_grad:
        traj.put("student_grad", 0, 0, 0, None, s.grad)
    if t.requires_grad:
        traj.put("teacher_grad", 0, 0, 0, None, t.grad)
    traj.put("student_after", 0, 0, 0, None, student)
    traj.put("teacher_after", 0, 0, 0, None, teacher)
    return traj
