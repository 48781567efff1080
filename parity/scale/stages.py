"""Rank-side stage checks for the scale cases: each stage of one training step re-evaluated in
float64 (references/stage_oracles.py) on the subject's own recorded inputs to that stage, compared
elementwise with what the subject produced, against the bound that stage's arithmetic allows
(parity/checks/tolerances.py, stage-local bounds).

Full logits do not travel to the parent at these shapes: every check runs where the tensors are
(the rank's GPU), in row chunks, and returns reductions only (elements checked, elements over the
bound, the worst error/bound ratio, max and RMS error). A stage fails when any element is over
its bound. Where a whole float64 recomputation would be a full-size float64 GEMM (the logits, the
input gradient), a seeded sample of rows is recomputed exactly and every row is covered by a
checksum (row sums of the logits, column sums of the weight gradient) with the summed bound.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from parity.checks import tolerances as tol
from references import stage_oracles as oracle

CHUNK_ELEMENTS = 1 << 26  # float64 working set per chunk: 512 MiB per temporary


class Tally:
    """Reductions of |subject - oracle| against an elementwise bound, accumulated over chunks."""

    def __init__(self, stage: str):
        self.stage, self.checked, self.over, self.worst, self.max_err, self.sumsq = stage, 0, 0, 0.0, 0.0, 0.0
        self.worst_at = None

    def add(self, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, where: int = 0) -> None:
        err = (got.to(torch.float64) - want).abs()
        ratio = torch.where(bound > 0, err / bound.clamp_min(torch.finfo(torch.float64).tiny),
                            torch.where(err > 0, torch.full_like(err, math.inf), torch.zeros_like(err)))
        ratio = torch.nan_to_num(ratio, nan=math.inf)  # a NaN anywhere is over any bound
        self.checked += err.numel()
        self.over += int((ratio > 1).sum())
        worst = float(ratio.max()) if ratio.numel() else 0.0
        if worst > self.worst or self.worst_at is None:
            self.worst, self.worst_at = max(worst, self.worst), where
        self.max_err = max(self.max_err, float(torch.nan_to_num(err, nan=math.inf).max()) if err.numel() else 0.0)
        self.sumsq += float(torch.nan_to_num(err, nan=0.0).pow(2).sum())

    def row(self) -> dict:
        return {"stage": self.stage, "checked": self.checked, "over_bound": self.over, "worst_ratio": self.worst,
                "max_abs_err": self.max_err, "rms_err": math.sqrt(self.sumsq / max(self.checked, 1)),
                "passed": self.over == 0 and self.checked > 0}


def _chunks(rows: int, width: int):
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    for lo in range(0, rows, step):
        yield slice(lo, min(rows, lo + step))


def _allreduce(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def logits_stage(h, w_local, z_local, rows, dtype: str) -> dict:
    """head input -> logits: sampled rows exactly, every row by its sum."""
    hidden = h.shape[-1]
    c_sum, c_out = tol.matmul_error_coeff(hidden, dtype)
    exact = Tally("logits (sampled rows)")
    z64 = oracle.linear64(h[rows], w_local)
    a = oracle.abs_linear64(h[rows], w_local)
    exact.add(z_local[rows], z64, c_sum * a + c_out * (z64.abs() + c_sum * a))
    sums = Tally("logits (row sums, every row)")
    w_sum, w_abs_sum = w_local.to(torch.float64).sum(0), w_local.to(torch.float64).abs().sum(0)
    for part in _chunks(h.shape[0], z_local.shape[-1]):
        zc = z_local[part].to(torch.float64)
        want = h[part].to(torch.float64) @ w_sum
        a_sum = h[part].to(torch.float64).abs() @ w_abs_sum
        bound = c_sum * a_sum + c_out * (zc.abs().sum(-1) + c_sum * a_sum)
        sums.add(zc.sum(-1), want, bound, part.start)
    return [exact.row(), sums.row()]


def softmax_stats(z_local, targets, start: int, ignore_index: int, group) -> dict:
    """float64 per-row max, log-sum-exp, target logit over the whole (sharded) vocabulary."""
    rows = z_local.shape[0]
    m = torch.empty(rows, dtype=torch.float64, device=z_local.device)
    for part in _chunks(rows, z_local.shape[-1]):
        m[part] = oracle.row_max64(z_local[part])
    _allreduce(m, group, dist.ReduceOp.MAX)
    s = torch.empty_like(m)
    zt = torch.empty_like(m)
    for part in _chunks(rows, z_local.shape[-1]):
        s[part] = oracle.row_sum_exp64(z_local[part], m[part])
        zt[part] = oracle.target_logit64(z_local[part], targets[part], start, ignore_index)
    _allreduce(s, group)
    _allreduce(zt, group)
    lse = m + torch.log(s)
    valid = targets != ignore_index
    count = int(valid.sum())
    return {"m": m, "lse": lse, "zt": zt, "valid": valid, "count": count,
            "loss": torch.where(valid, lse - zt, torch.zeros_like(lse))}


def mean_loss_stage(loss, stats, vocab: int) -> dict:
    """logits + targets -> mean loss (the subject's scalar), bound from the fp32 CE's arithmetic."""
    u32 = tol.unit_roundoff("fp32")
    n = max(stats["count"], 1)
    per_token = tol.ce_sum_coeff(vocab) + tol.ce_unit_coeff() * (
        stats["m"].abs() + stats["lse"].abs() + stats["zt"].abs() + stats["loss"].abs())
    per_token = torch.where(stats["valid"], per_token, torch.zeros_like(per_token))
    want = stats["loss"].sum() / n
    bound = per_token.sum() / n + tol.gamma(n, u32) * stats["loss"].abs().sum() / n + u32 * want.abs()
    t = Tally("loss (mean)")
    t.add(loss.detach().reshape(1), want.reshape(1), bound.reshape(1))
    return t.row()


def dlogits_stage(z_local, grad_local, targets, start: int, ignore_index: int, stats, vocab: int,
                  grad_dtype: str) -> dict:
    """logits + targets -> d(mean loss)/d(logits), every element."""
    n = max(stats["count"], 1)
    rel_sum, rel_unit = tol.ce_sum_coeff(vocab), tol.ce_unit_coeff()
    out = tol.ce_grad_out_coeff(grad_dtype)
    scale = stats["valid"].to(torch.float64) / n
    t = Tally("dlogits (every element)")
    for part in _chunks(z_local.shape[0], z_local.shape[-1]):
        g64, p = oracle.softmax_grad64(z_local[part], targets[part], start, stats["lse"][part], scale[part],
                                       ignore_index)
        mag = 1 + z_local[part].to(torch.float64).abs() + (stats["m"][part].abs() + stats["lse"][part].abs()).unsqueeze(-1)
        bound = scale[part].unsqueeze(-1) * p * (rel_sum + rel_unit * mag) + out * g64.abs()
        t.add(grad_local[part], g64, bound, part.start)
    return t.row()


def weight_grad_stage(grad_local, h, w_grad, vocab_rows, grad_dtype: str) -> list[dict]:
    """dlogits x head input -> weight gradient: sampled vocabulary rows exactly, every column by its sum."""
    tokens = h.shape[0]
    c_sum, c_out = tol.matmul_error_coeff(tokens, grad_dtype)
    g = grad_local[:, vocab_rows].to(torch.float64)
    h64 = h.to(torch.float64)
    want = g.T @ h64
    a = g.abs().T @ h64.abs()
    exact = Tally("weight grad (sampled rows)")
    exact.add(w_grad[vocab_rows], want, c_sum * a + c_out * (want.abs() + c_sum * a))
    g_sum = torch.zeros(tokens, dtype=torch.float64, device=h.device)
    g_abs = torch.zeros_like(g_sum)
    for part in _chunks(tokens, grad_local.shape[-1]):
        gc = grad_local[part].to(torch.float64)
        g_sum[part], g_abs[part] = gc.sum(-1), gc.abs().sum(-1)
    want_cols = g_sum @ h64
    a_cols = g_abs @ h64.abs()
    got_cols = torch.zeros_like(want_cols)
    got_abs = torch.zeros_like(want_cols)
    for part in _chunks(w_grad.shape[0], w_grad.shape[-1]):
        wc = w_grad[part].to(torch.float64)
        got_cols += wc.sum(0)
        got_abs += wc.abs().sum(0)
    cols = Tally("weight grad (column sums, every row)")
    cols.add(got_cols, want_cols, c_sum * a_cols + c_out * (got_abs + c_sum * a_cols))
    return [exact.row(), cols.row()]


def hidden_grad_stage(grad_rows, w_local, h_grad_rows, grad_dtype: str, tp: int, group) -> dict:
    """dlogits x weight -> head input gradient (summed over TP ranks), sampled rows."""
    c_sum, c_out = tol.matmul_error_coeff(w_local.shape[0], grad_dtype)
    want = _allreduce(grad_rows.to(torch.float64) @ w_local.to(torch.float64), group)
    a = _allreduce(grad_rows.to(torch.float64).abs() @ w_local.to(torch.float64).abs(), group)
    # each rank's partial is rounded to the grad dtype once, then tp partials are summed in it
    across = c_out + (tol.gamma(tp, c_out) if tp > 1 else 0.0)
    t = Tally("hidden grad (sampled rows)")
    t.add(h_grad_rows, want, (c_sum + across) * a + c_out * want.abs())
    return t.row()


def sgd_stage(w_old, grad, w_new, lr: float, weight_dtype: str) -> dict:
    """weight + gradient -> SGD update, every element of this rank's shard."""
    c_w, c_g = tol.sgd_error_coeff(weight_dtype)
    t = Tally("sgd update (every element)")
    for part in _chunks(w_old.shape[0], w_old.shape[-1]):
        want = oracle.sgd64(w_old[part], grad[part], lr)
        bound = c_w * want.abs() + c_g * lr * grad[part].to(torch.float64).abs()
        t.add(w_new[part], want, bound, part.start)
    return t.row()


def exact_stage(name: str, got: torch.Tensor, want: torch.Tensor) -> dict:
    """No arithmetic: bitwise equal (the shard a layer took from the full weight)."""
    t = Tally(name)
    same = got.shape == want.shape and torch.equal(got, want)
    t.checked, t.over = max(got.numel(), 1), 0 if same else max(got.numel(), 1)
    t.worst = 0.0 if same else math.inf
    return t.row()
