"""DeepSpeed 0.19.8: vocab_parallel_kl_div gives a masked vocabulary a finite KL; torch's F.kl_div gives nan.

A distillation teacher often masks ids to -inf (top-k / top-p filtering, a constrained vocabulary). The KL a
user without tensor parallelism writes, F.kl_div(log_softmax(student), log_softmax(teacher), log_target=True)
(KL(teacher || student)), computes exp(t) * (t - s) per id, and at an id the teacher masks that is
exp(-inf) * (-inf - s) = 0 * -inf = nan: the row's KL and the teacher's whole gradient row are nan (and where both
mask the same id, the student's too in the reverse direction). DeepSpeed's `_weighted_by_probs` drops an id whose
log-probability is -inf ("Tokens masked to -inf contribute nothing ... without this, 0 * -inf turns the whole row
into NaN", vocab_parallel_ops.py:74-80): a finite KL, the KL over the weighting side's support (0 log 0 = 0), which
this script recomputes in float64 from that definition. An id only the other side masks is +inf in both. So
DeepSpeed's number differs from plain torch's, by design, and is the true KL: an intended difference.

Run (CPU, 2 ranks, about 15 s):  python ci/repro/deepspeed_kl_div_masked_ids_finite.py
Exit status 1 while DeepSpeed's KL or gradients at a masked row differ from F.kl_div's (a number against nan), 0
once they agree; it prints whether DeepSpeed's numbers are the support KL's.

Finding: findings/deepspeed_kl_div_masked_ids_finite.toml
"""
import importlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, TOKENS = 2, 10, 3
TEACHER_MASKS, BOTH_MASK = 1, 2  # row 0 unmasked; row 1: the teacher masks ids 0 and 9; row 2: both mask 3 and 6


def inputs():
    gen = torch.Generator().manual_seed(0)
    student = 3 * torch.randn(TOKENS, VOCAB, generator=gen)
    teacher = student + 2 * torch.randn(TOKENS, VOCAB, generator=gen)
    teacher[TEACHER_MASKS, [0, VOCAB - 1]] = float("-inf")
    student[BOTH_MASK, [3, 6]] = teacher[BOTH_MASK, [3, 6]] = float("-inf")
    return student, teacher


def kl(student, teacher, reverse, support_only):
    """Per-token KL(teacher || student) (reverse: KL(student || teacher)) from log_softmax. support_only: ids the
    weighting side masks dropped (0 log 0 = 0; their -inf made 0 first, so autograd sees no 0 * inf); else
    torch's F.kl_div(log_target=True) as a user writes it."""
    log_s, log_t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
    a, b = (log_s, log_t) if reverse else (log_t, log_s)
    if not support_only:
        return F.kl_div(b, a, log_target=True, reduction="none").sum(-1)
    dropped = a == float("-inf")
    a_safe, b_safe = a.masked_fill(dropped, 0.0), b.masked_fill(dropped, 0.0)
    return (a.exp() * (a_safe - b_safe)).masked_fill(dropped, 0.0).sum(-1)


def plain(reverse, support_only, dtype):
    s, t = (x.to(dtype).requires_grad_(True) for x in inputs())
    value = kl(s, t, reverse, support_only)
    value.sum().backward()
    return value.detach(), s.grad, t.grad


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.distributed as dist
    from deepspeed.sequence.vocab_parallel_ops import vocab_parallel_kl_div

    deepspeed.init_distributed(dist_backend="gloo")
    part = slice(rank * VOCAB // TP, (rank + 1) * VOCAB // TP)
    out = {}
    for reverse in (False, True):
        s, t = (x[:, part].clone().requires_grad_(True) for x in inputs())
        value = vocab_parallel_kl_div(s, t, reverse=reverse, tp_group=dist.group.WORLD)
        value.sum().backward()
        out[reverse] = (value.detach(), s.grad, t.grad)
    result[rank] = out


def same(x, y, tol):
    return bool(torch.equal(x.isnan(), y.isnan()) and torch.equal(x.isinf(), y.isinf())
                and torch.allclose(x.nan_to_num(posinf=0, neginf=0).double(), y.nan_to_num(posinf=0, neginf=0).double(),
                                   atol=tol, rtol=tol))


if __name__ == "__main__":
    got = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    differs = False
    for reverse in (False, True):
        name = "reverse KL(student || teacher)" if reverse else "forward KL(teacher || student)"
        ds = (got[0][reverse][0], *(torch.cat([got[r][reverse][i] for r in range(TP)], -1) for i in (1, 2)))
        torch_kl = plain(reverse, False, torch.float32)
        support = plain(reverse, True, torch.float64)
        print(f"{name}: per-token KL, rows unmasked / teacher masks 2 ids / both mask 2 ids")
        print(f"  torch F.kl_div     {[round(v, 4) for v in torch_kl[0].tolist()]}")
        print(f"  DeepSpeed          {[round(v, 4) for v in ds[0].tolist()]}")
        print(f"  support KL (fp64)  {[round(v, 4) for v in support[0].tolist()]}")
        for i, side in ((1, "student"), (2, "teacher")):
            nan_torch, nan_ds = int(torch_kl[i].isnan().sum()), int(ds[i].isnan().sum())
            print(f"  {side} gradient: nan entries torch {nan_torch}, DeepSpeed {nan_ds}; DeepSpeed equals the support "
                  f"KL's: {same(ds[i], support[i], 1e-5)}")
        print(f"  DeepSpeed's KL equals the support KL's: {same(ds[0], support[0], 1e-5)}")
        differs |= not all(same(ds[i], torch_kl[i], 1e-5) for i in range(3))
    print("DIFFERS: DeepSpeed's KL over a masked vocabulary is finite where torch's F.kl_div gives nan"
          if differs else "DeepSpeed's KL is torch's F.kl_div's")
    sys.exit(1 if differs else 0)
