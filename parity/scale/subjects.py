"""The scale cases' subjects, driven in a rank process: one forward, one backward and one plain SGD
step of one micro-batch (at production shapes one step is enough to exercise every stage; a
trajectory adds nothing a stage check does not see), then the stage checks (parity/scale/stages.py)
on the tensors the subject produced.

The heads are DeepSpeed 0.19.8's AutoTP layers built directly around a user's nn.Linear, as the
engine builds them (parity/subjects/deepspeed_direct.py does the same on the CPU matrix), with
no engine around them: deepspeed.initialize would add a full-vocabulary embedding, a bf16
optimizer with fp32 master weights and ZeRO buckets, none of which the head's parity depends on,
and which at vocabulary 256000 x hidden 4096 cost several GiB per rank for nothing checked here.
- vocab_parallel: VocabParallelLinear + deepspeed.sequence.cross_entropy.vocab_parallel_cross_entropy
  (reduction mean, the layer's own vocabulary bounds), backend torch or liger; the backend that
  ran is recorded (DeepSpeed's gate: Liger on a Triton accelerator with equal shards).
- column_gathered: LinearLayer(gather_output=True) + the suite's CE (fp32 upcast, F.cross_entropy
  mean, as HF's loss does); each rank checks its own columns of the gathered logits.
- fused_linear_ce: deepspeed.sequence.linear_cross_entropy.vocab_parallel_linear_cross_entropy on this
  rank's weight rows, reduction none (per-token losses, so sampled rows can be checked), objective
  sum / N; logits never exist, so its stages are checked from the head input on sampled rows.

``plant`` (tests only) puts a known error into one stage so a test can show the check fails.
"""
from __future__ import annotations

import gc
import time

import torch
import torch.nn.functional as F

from parity.observe.dtypes import DTYPES
from parity.observe.partition import shard_slice
from parity.scale import stages
from parity.checks import tolerances as tol
from references import stage_oracles as oracle

IGNORE_INDEX = -100
IGNORE_EVERY = 16  # every 16th token is ignored (padding), so the mean's count is exercised
# plant -> the stage (row name prefix) whose check must fail
PLANTS = {"logits": "logits", "loss": "loss", "dlogits": "dlogits", "weight_grad": "weight grad",
          "hidden_grad": "hidden grad", "update": "sgd update", "shard": "weight shard"}


def make_inputs(case: dict, device):
    """Seeded on the device, the same on every rank: head input, full head weight, targets."""
    gen = torch.Generator(device=device).manual_seed(case["seed"])
    dtype = DTYPES[case["dtype"]]
    t, v, hdim = case["tokens"], case["vocab"], case["hidden"]
    h = torch.randn(t, hdim, generator=gen, device=device).to(dtype)
    # logits of a few units (std 4), as a trained LM's are, not the near-uniform softmax of N(0, 1)
    w = (torch.randn(v, hdim, generator=gen, device=device) * (4.0 / hdim ** 0.5)).to(dtype)
    targets = torch.randint(0, v, (t,), generator=gen, device=device)
    targets[::IGNORE_EVERY] = IGNORE_INDEX
    return h, w, targets


def sample_rows(n: int, count: int, seed: int, device) -> torch.Tensor:
    """count seeded rows of n, always the first and the last (planted errors sit at row 0)."""
    gen = torch.Generator().manual_seed(seed)
    picked = torch.randperm(n, generator=gen)[:max(count - 2, 0)]
    return torch.unique(torch.cat([torch.tensor([0, n - 1]), picked])).to(device)


class _PlantGrad(torch.autograd.Function):
    """Identity forward; backward scales the gradient of element [0, 0] (a planted CE-backward bug)."""

    @staticmethod
    def forward(ctx, z):
        return z.view_as(z)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        g[0, 0] = g[0, 0] * 1.5 + 1e-2
        return g


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nudge(t: torch.Tensor, index) -> None:
    """A planted error well above any stage's bound: 5% of the element's magnitude plus 0.1 of its tensor's scale."""
    with torch.no_grad():
        t[index] += t[index].abs() * 0.05 + 0.1 * float(t.abs().max()) + 1e-3


def run_case(case: dict, device, group, tp_rank: int, tp: int, deps) -> dict:
    """One case on this rank -> {"rows": stage rows, "facts": ..., "timing": ...}."""
    subject, plant = case["subject"], case.get("plant")
    dtype = DTYPES[case["dtype"]]
    part = shard_slice(case["vocab"], tp, tp_rank)
    gc.collect()  # the previous case's autograd graph and layers sit in reference cycles until collected
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    t0 = time.perf_counter()
    h, w_full, targets = make_inputs(case, device)
    x = h.clone().requires_grad_(True)
    facts, rows = {}, []
    backend_log: list = []
    if subject == "fused_linear_ce":
        weight = torch.nn.Parameter(w_full[part].clone())
    else:
        head = torch.nn.Linear(case["hidden"], case["vocab"], bias=False, device=device, dtype=dtype)
        with torch.no_grad():
            head.weight.copy_(w_full)
        if plant == "shard":  # the layer takes rows one past its own
            with torch.no_grad():
                head.weight.copy_(torch.roll(w_full, 1, 0))
        layer = (deps.VocabParallelLinear(head, group) if subject == "vocab_parallel"
                 else deps.LinearLayer(head, group, gather_output=True))
        del head
        weight = layer.weight
        w_shard_taken = weight.detach()
    if subject != "fused_linear_ce":  # the fused op is handed its rows by the caller: nothing of its own to check
        rows.append(stages.exact_stage("weight shard (bitwise, from the full weight)", w_shard_taken, w_full[part]))
    w_old = weight.detach().clone()
    del w_full
    with deps.record_loss_backend(backend_log):
        if subject == "fused_linear_ce":
            per_token = deps.vocab_parallel_linear_cross_entropy(
                x, weight, targets, tp_group=group, vocab_start_index=part.start, vocab_end_index=part.stop,
                ignore_index=IGNORE_INDEX, reduction="none")
            if plant == "loss":
                per_token = per_token * (1 + 1e-3)
            count = int((targets != IGNORE_INDEX).sum())
            (per_token.sum() / max(count, 1)).backward()
            loss = per_token.detach()
        else:
            z = layer(x)
            if plant == "logits":
                z = z + torch.nn.functional.pad(torch.ones(1, 1, device=device, dtype=z.dtype),
                                                (0, z.shape[1] - 1, 0, z.shape[0] - 1)) * (float(z.detach().abs().max()) * 0.1 + 1)
            z.retain_grad()
            z_ce = _PlantGrad.apply(z) if plant == "dlogits" else z
            if subject == "vocab_parallel":
                loss = deps.vocab_parallel_cross_entropy(
                    z_ce, targets, tp_group=group, vocab_start_index=layer.vocab_start_index,
                    vocab_end_index=layer.vocab_end_index, global_vocab_size=case["vocab"],
                    ignore_index=IGNORE_INDEX, reduction="mean", backend=case["backend"])
            else:
                loss = F.cross_entropy(z_ce.float(), targets, ignore_index=IGNORE_INDEX, reduction="mean")
            if plant == "loss":
                loss = loss * (1 + 1e-3)
            loss.backward()
    if plant == "weight_grad":
        _nudge(weight.grad, (0, 0))
    if plant == "hidden_grad":
        _nudge(x.grad, (0, 0))
    opt = torch.optim.SGD([weight], lr=case["lr"])
    opt.step()
    if plant == "update":
        _nudge(weight.data, (0, 0))
    _sync(device)
    subject_s = time.perf_counter() - t0
    subject_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    facts["loss_backend"] = backend_log
    facts["loss"] = float(loss.detach().float().sum() / max(int((targets != IGNORE_INDEX).sum()), 1)) \
        if subject == "fused_linear_ce" else float(loss.detach())

    # ---- stage checks, on this rank's device --------------------------------------------------
    t1 = time.perf_counter()
    vocab, dt = case["vocab"], case["dtype"]
    sample = sample_rows(case["tokens"], case["samples"], case["seed"] + 1, device)
    vocab_rows = sample_rows(part.stop - part.start, case["samples"], case["seed"] + 2, device)
    with torch.no_grad():
        if subject == "fused_linear_ce":
            rows += fused_stages(h, w_old, targets, loss, x.grad, part, sample, case, group, tp)
        else:
            # gathered logits: every rank holds all columns and checks its own
            z_local = z.detach() if subject == "vocab_parallel" else z.detach()[:, part]
            g_local = z.grad if subject == "vocab_parallel" else z.grad[:, part]
            rows += stages.logits_stage(h, w_old, z_local, sample, dt)
            stats = stages.softmax_stats(z_local, targets, part.start, IGNORE_INDEX, group)
            rows.append(stages.mean_loss_stage(loss, stats, vocab))
            rows.append(stages.dlogits_stage(z_local, g_local, targets, part.start, IGNORE_INDEX, stats, vocab, dt))
            rows += stages.weight_grad_stage(g_local, h, weight.grad, vocab_rows, dt)
            # the head input's gradient: each rank's columns times its shard, summed over the TP ranks
            rows.append(stages.hidden_grad_stage(g_local[sample], w_old, x.grad[sample], dt, tp, group))
        rows.append(stages.sgd_stage(w_old, weight.grad, weight.detach(), case["lr"], dt))
    _sync(device)
    timing = {"baseline_bytes": baseline, "subject_s": subject_s, "oracle_s": time.perf_counter() - t1, "subject_peak_bytes": subject_peak,
              "case_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None}
    return {"rows": rows, "facts": facts, "timing": timing}


def fused_stages(h, w_local, targets, per_token, h_grad, part, sample, case, group, tp) -> list[dict]:
    """The fused op exposes no logits: its loss and input gradient are checked from the head input on
    sampled rows, the logits' own rounding carried through (a logit error d moves a loss by <= 2d)."""
    dt = case["dtype"]
    c_sum, c_out = tol.matmul_error_coeff(case["hidden"], dt)
    z64 = oracle.linear64(h[sample], w_local)
    a = oracle.abs_linear64(h[sample], w_local)
    d = (c_sum * a + c_out * (z64.abs() + c_sum * a)).amax(-1)
    stages._allreduce(d, group, torch.distributed.ReduceOp.MAX)
    zmax = stages._allreduce(z64.abs().amax(-1), group, torch.distributed.ReduceOp.MAX)
    stats = stages.softmax_stats(z64, targets[sample], part.start, IGNORE_INDEX, group)
    rel_sum, rel_unit = tol.ce_sum_coeff(case["vocab"]), tol.ce_unit_coeff()
    bound = 2 * d + rel_sum + rel_unit * (stats["m"].abs() + stats["lse"].abs() + stats["zt"].abs() + stats["loss"].abs())
    loss_t = stages.Tally("loss (per token, sampled rows)")
    loss_t.add(per_token[sample], stats["loss"], torch.where(stats["valid"], bound, torch.zeros_like(bound)))
    n = max(int((targets != IGNORE_INDEX).sum()), 1)
    scale = stats["valid"].to(torch.float64) / n
    g64, p = oracle.softmax_grad64(z64, targets[sample], part.start, stats["lse"], scale, IGNORE_INDEX)
    rho = 2 * d + rel_sum + rel_unit * (1 + zmax + stats["m"].abs() + stats["lse"].abs())
    u_g = tol.unit_roundoff(dt)
    dg = scale.unsqueeze(-1) * p * rho.unsqueeze(-1) + u_g * g64.abs()
    w64 = w_local.to(torch.float64)
    want = stages._allreduce(g64 @ w64, group)
    from_g = stages._allreduce(dg @ w64.abs(), group)
    mag = stages._allreduce(g64.abs() @ w64.abs(), group)
    m_sum, m_out = tol.matmul_error_coeff(w_local.shape[0], dt)
    across = m_out + (tol.gamma(tp, m_out) if tp > 1 else 0.0)
    dh_t = stages.Tally("hidden grad (sampled rows, from the head input)")
    dh_t.add(h_grad[sample], want, from_g + (m_sum + across) * mag + m_out * want.abs())
    return [loss_t.row(), dh_t.row()]
