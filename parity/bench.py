"""parity bench: figures (never a timed test) for DeepSpeed's vocabulary-parallel CE backends.

Stage 1 -- the CE op alone (deepspeed.sequence.cross_entropy.vocab_parallel_cross_entropy,
reduction "mean"), forward + backward, per backend ("torch" | "liger"): median milliseconds over
--repeats runs after --warmup runs, and the peak allocated memory of one forward + backward
(input logits included). --tp 1 (default): DeepSpeed selects Liger only behind an explicit
tensor-parallel group, so the op gets a size-1 group made with new_group([0]). --tp N: N ranks each
hold --local-vocab columns of an N x local-vocab vocabulary (the seed's TP=2 setting), so the
figures include the CE's all-reduces; times are reported for rank 0 and as the slowest rank.

Stage 2 -- the seed PR's memory profile: a local linear (hidden -> vocab/TP) + vocabulary-parallel
CE forward/backward, 5 SGD updates (lr 0.05) of 2 micro-batches each, on TP ranks. After one
warm-up update the weights are reset and the peak statistics cleared; reported are the peak
allocated bytes and the peak over the baseline (bytes allocated right after the reset), the maximum
across ranks. Ranks are placed by parity.harness.placement: one per GPU over NCCL when there are enough
GPUs, else sharing cuda:0 over gloo (see shared/notes/liger-and-gpu.md).

Which backend actually ran is counted, not assumed: DeepSpeed's _liger_vocab_cross_entropy and
_VocabParallelCrossEntropy are wrapped with call counters in every rank. A backend that cannot run
where it was asked to (Liger on CPU: DeepSpeed's gate needs an accelerator with Triton) is reported
as "not run: <reason>"; on CUDA that is an error, and so is Liger requested but torch observed.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

BACKENDS = ("torch", "liger")
GiB, MiB = float(1 << 30), float(1 << 20)

# Full sizes are the seed's; CPU sizes keep a smoke run well under a minute.
DEFAULTS = {
    "cuda": dict(tokens=[8192, 16384], local_vocab=16000, repeats=20, warmup=5,
                 mem_hidden=128, mem_vocab=65536, mem_tokens=1024),
    "cpu": dict(tokens=[256, 512], local_vocab=1024, repeats=5, warmup=2,
                mem_hidden=32, mem_vocab=4096, mem_tokens=128),
}
MEM_TP, MEM_STEPS, MEM_MICRO, MEM_LR = 2, 5, 2, 0.05


# ----------------------------------------------------------------------------------------------
# rank side
# ----------------------------------------------------------------------------------------------
class _Counters:
    """Wraps DeepSpeed's two CE paths so every call is counted in this process."""

    def __init__(self):
        import deepspeed.sequence.cross_entropy as ce_mod

        self.counts = {"liger": 0, "torch": 0}
        counts = self.counts
        liger_fn, torch_fn = ce_mod._liger_vocab_cross_entropy, ce_mod._VocabParallelCrossEntropy

        def counted_liger(*args, **kwargs):
            counts["liger"] += 1
            return liger_fn(*args, **kwargs)

        class CountedTorch:
            @staticmethod
            def apply(*args):
                counts["torch"] += 1
                return torch_fn.apply(*args)

        # vocab_parallel_cross_entropy looks both names up in its module at call time.
        ce_mod._liger_vocab_cross_entropy = counted_liger
        ce_mod._VocabParallelCrossEntropy = CountedTorch
        self.ce = ce_mod.vocab_parallel_cross_entropy
        self._restore = lambda: (setattr(ce_mod, "_liger_vocab_cross_entropy", liger_fn),
                                 setattr(ce_mod, "_VocabParallelCrossEntropy", torch_fn))

    def restore(self):
        self._restore()

    def reset(self):
        self.counts.update(liger=0, torch=0)

    def check(self, backend: str, expected: int) -> dict:
        """The requested backend ran exactly `expected` times and the other never; else raise."""
        other = "torch" if backend == "liger" else "liger"
        got = dict(self.counts)
        if got[backend] != expected or got[other] != 0:
            raise RuntimeError(f"backend {backend!r} was requested for {expected} CE calls, but DeepSpeed ran "
                               f"liger {got['liger']} and torch {got['torch']} times"
                               + (" (Liger's gate fell back to torch)" if backend == "liger" else ""))
        return got


def liger_unavailable(device: str) -> str | None:
    """Why DeepSpeed's gate (_liger_can_run) would refuse Liger here, or None if it would run."""
    if find_spec("liger_kernel") is None:
        return "liger-kernel is not installed"
    if find_spec("triton") is None:
        return "triton is not installed"
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if not acc.is_triton_supported():
        return (f"DeepSpeed's accelerator {acc._name!r} reports no Triton support on device {device!r} "
                "(_liger_can_run would fall back to torch)")
    return None


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device) -> int:
    """Clear the peak statistic; returns bytes allocated now (0 on CPU, where there is none)."""
    import torch

    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak(device) -> int | None:
    import torch

    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def stage1(cfg, device, group, rank, counters) -> list[dict]:
    import torch

    dtype = torch.bfloat16
    vocab, tp = cfg["local_vocab"], cfg["tp"]
    lo, hi = rank * vocab, (rank + 1) * vocab
    rows = []
    for tokens in cfg["tokens"]:
        # Every rank draws the same full logits and targets, then keeps its own vocabulary slice.
        gen = torch.Generator().manual_seed(1000 + tokens)
        logits_host = torch.randn(tokens, vocab * tp, generator=gen)[:, lo:hi].mul(2.0).to(dtype).contiguous()
        target_host = torch.randint(0, vocab * tp, (tokens,), generator=gen)
        for backend in cfg["backends"]:
            row = {"tokens": tokens, "local_vocab": vocab, "tp": tp, "rank": rank, "backend": backend}
            rows.append(row)
            reason = liger_unavailable(cfg["device"]) if backend == "liger" else None
            if reason:
                row["status"] = f"not run: {reason}"
                continue
            logits = logits_host.to(device).requires_grad_(True)
            target = target_host.to(device)

            def step():
                logits.grad = None
                loss = counters.ce(logits, target, tp_group=group, vocab_start_index=lo, vocab_end_index=hi,
                                   global_vocab_size=vocab * tp, reduction="mean", backend=backend)
                loss.backward()
                return loss

            for _ in range(cfg["warmup"]):
                step()
            counters.reset()
            times, peaks = [], []
            for _ in range(cfg["repeats"]):
                logits.grad = None
                baseline = _reset_peak(device)
                if device.type == "cuda":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    loss = step()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    loss = step()
                    times.append((time.perf_counter() - t0) * 1e3)
                peaks.append(_peak(device))
            calls = counters.check(backend, cfg["repeats"])
            row.update(status="ran", observed=backend, calls=calls,
                       ms_median=statistics.median(times), ms_min=min(times), ms_max=max(times),
                       peak_allocated_bytes=max(peaks) if peaks[0] is not None else None,
                       baseline_bytes=baseline if device.type == "cuda" else None,
                       loss=float(loss.detach()), grad_abs_sum=float(logits.grad.float().abs().sum()))
            del logits, target, loss
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def stage2(cfg, device, group, rank, counters) -> list[dict]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    dtype, tp = torch.bfloat16, MEM_TP
    hidden, vocab, tokens = cfg["mem_hidden"], cfg["mem_vocab"], cfg["mem_tokens"]
    if vocab % tp:
        raise ValueError(f"--mem-vocab {vocab} must divide by TP={tp} (Liger needs equal shards)")
    local = vocab // tp
    lo, hi = rank * local, (rank + 1) * local
    gen = torch.Generator().manual_seed(77)  # every TP rank sees the same tokens and the same full weight
    w_full = torch.randn(vocab, hidden, generator=gen) * hidden ** -0.5
    xs_host = [torch.randn(tokens, hidden, generator=gen) for _ in range(MEM_MICRO)]
    ts_host = [torch.randint(0, vocab, (tokens,), generator=gen) for _ in range(MEM_MICRO)]
    rows = []
    for backend in cfg["backends"]:
        row = {"backend": backend, "rank": rank}
        rows.append(row)
        reason = liger_unavailable(cfg["device"]) if backend == "liger" else None
        if reason:
            row["status"] = f"not run: {reason}"
            continue
        w0 = w_full[lo:hi].to(device, dtype)
        weight = torch.nn.Parameter(w0.clone())
        opt = torch.optim.SGD([weight], lr=MEM_LR)
        xs = [x.to(device, dtype) for x in xs_host]
        ts = [t.to(device) for t in ts_host]
        losses = []

        def update():
            step_loss = 0.0
            for x, t in zip(xs, ts):
                logits = F.linear(x, weight)
                loss = counters.ce(logits, t, tp_group=group, vocab_start_index=lo, vocab_end_index=hi,
                                   global_vocab_size=vocab, reduction="mean", backend=backend) / MEM_MICRO
                loss.backward()
                step_loss = step_loss + loss.detach()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return step_loss

        update()  # warm-up: kernels compiled, allocator primed
        with torch.no_grad():
            weight.copy_(w0)
        opt.zero_grad(set_to_none=True)
        _sync(device)
        dist.barrier()
        baseline = _reset_peak(device)
        counters.reset()
        t0 = time.perf_counter()
        for _ in range(MEM_STEPS):
            losses.append(update())
        _sync(device)
        elapsed = time.perf_counter() - t0
        peak = _peak(device)
        calls = counters.check(backend, MEM_STEPS * MEM_MICRO)
        row.update(status="ran", observed=backend, calls=calls, elapsed_s=elapsed,
                   peak_allocated_bytes=peak, baseline_bytes=baseline if peak is not None else None,
                   incremental_peak_bytes=(peak - baseline) if peak is not None else None,
                   losses=[float(v) for v in losses],
                   weight_sum=float(weight.detach().double().sum()))
        del weight, opt, xs, ts, w0, losses
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def rank_main(rank: int, world: int, cfg: dict, port: int, out_dir: str) -> None:
    from parity.harness.rank_worker import send_output_to

    out = Path(out_dir)
    log = send_output_to(out / f"rank{rank}.log")
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if cfg["device"] == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import importlib

        import torch
        import torch.distributed as dist

        from parity.harness.placement import place_rank, use_placement

        placement = place_rank(rank, world, cfg["device"])
        use_placement(placement)
        device = torch.device(placement.device)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
        # No device_id: with it DeepSpeed's group splitting fails on a shared GPU.
        dist.init_process_group(placement.backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=600))
        # The CPU shm op is JIT-compiled (35-100 s) and only serves inference_all_reduce.
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        import deepspeed

        deepspeed.init_distributed(dist_backend=placement.backend)
        counters = _Counters()
        # new_group is collective: every rank makes every group, members or not.
        stage1_group = dist.new_group(list(range(cfg["tp"])))
        stage2_group = dist.new_group(list(range(MEM_TP)))
        result = {"rank": rank, "device": str(device), "mode": placement.mode,
                  "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
        if "1" in cfg["stages"]:
            if rank < cfg["tp"]:
                result["stage1"] = stage1(cfg, device, stage1_group, rank, counters)
            dist.barrier()
        if "2" in cfg["stages"]:
            if rank < MEM_TP:
                result["stage2"] = stage2(cfg, device, stage2_group, rank, counters)
            dist.barrier()
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        log.flush()
        os._exit(1)


# ----------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------
def _version(*names: str) -> str:
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def environment(device: str) -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "triton": _version("triton", "pytorch-triton"), "cuda": torch.version.cuda,
           "deepspeed": _version("deepspeed"), "liger-kernel": _version("liger-kernel", "liger_kernel"),
           "device": device, "gpu": None}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return env


def spawn_ranks(world: int, cfg: dict, timeout_s: float) -> list[dict]:
    import torch.distributed as dist

    out_dir = tempfile.mkdtemp(prefix="parity-bench-")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, world, cfg, store.port, out_dir), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    deadline, failed_at = time.monotonic() + timeout_s, None
    while any(p.is_alive() for p in procs):
        time.sleep(0.1)
        if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
            failed_at = time.monotonic()
        now = time.monotonic()
        if now > deadline or (failed_at is not None and now > failed_at + 10):
            break
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=5)
    out = Path(out_dir)
    results, problems = [], []
    for r, p in enumerate(procs):
        res, err = out / f"rank{r}.json", out / f"rank{r}.error"
        if err.exists():
            problems.append(f"--- rank {r} raised ---\n{err.read_text()}")
        elif p.exitcode == 0 and res.exists():
            results.append(json.loads(res.read_text()))
        else:
            log = (out / f"rank{r}.log")
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            why = "timed out" if p.exitcode is None or p.exitcode < 0 else f"exit code {p.exitcode}"
            problems.append(f"--- rank {r} {why} (timeout {timeout_s:.0f} s); log tail ---\n{tail}")
    if problems:
        raise RuntimeError(f"bench ranks failed (logs in {out_dir}):\n" + "\n".join(problems))
    return results


def _gib(b):
    return "n/a" if b is None else f"{b / GiB:.3f}"


def _mib(b):
    return "n/a" if b is None else f"{b / MiB:.2f}"


def _ratio(a, b, fmt="{:.2f}x"):
    return "n/a" if a is None or b is None or not b else fmt.format(a / b)


def summarize(cfg: dict, env: dict, results: list[dict]) -> dict:
    by_rank = {r["rank"]: r for r in results}
    summary = {"environment": env, "config": cfg, "stage1": [], "stage1_ratios": [], "stage2": [],
               "stage2_ratio": None, "problems": []}
    summary["mode"] = by_rank[0].get("mode") if by_rank else None
    if "1" in cfg["stages"]:
        rows = by_rank[0]["stage1"]
        summary["stage1"] = rows
        # With TP > 1 every rank times its own shard; the step is as slow as the slowest rank.
        for row in rows:
            if row["status"] == "ran":
                peers = [p for r in results for p in r.get("stage1", [])
                         if p["tokens"] == row["tokens"] and p["backend"] == row["backend"] and p["status"] == "ran"]
                row["ms_median_slowest_rank"] = max(p["ms_median"] for p in peers)
                row["calls_per_rank"] = [p["calls"] for p in sorted(peers, key=lambda p: p["rank"])]
        for tokens in cfg["tokens"]:
            pair = {r["backend"]: r for r in rows if r["tokens"] == tokens and r["status"] == "ran"}
            if "torch" in pair and "liger" in pair:
                t, l = pair["torch"], pair["liger"]
                summary["stage1_ratios"].append({
                    "tokens": tokens, "speedup_torch_over_liger": t["ms_median"] / l["ms_median"],
                    "peak_liger_over_torch": (l["peak_allocated_bytes"] / t["peak_allocated_bytes"]
                                              if t["peak_allocated_bytes"] else None),
                    "loss_abs_diff": abs(t["loss"] - l["loss"])})
    if "2" in cfg["stages"]:
        for backend in cfg["backends"]:
            per_rank = [row for r in results for row in r.get("stage2", []) if row["backend"] == backend]
            ran = [row for row in per_rank if row["status"] == "ran"]
            if len(ran) != len(per_rank):
                summary["stage2"].append({"backend": backend, "status": per_rank[0]["status"], "per_rank": per_rank})
                continue
            mx = (lambda k: None if ran[0][k] is None else max(row[k] for row in ran))
            summary["stage2"].append({
                "backend": backend, "status": "ran", "observed": backend, "ranks": len(ran),
                "calls_per_rank": ran[0]["calls"], "peak_allocated_bytes": mx("peak_allocated_bytes"),
                "incremental_peak_bytes": mx("incremental_peak_bytes"), "baseline_bytes": mx("baseline_bytes"),
                "elapsed_s": mx("elapsed_s"), "final_loss": ran[0]["losses"][-1],
                "weight_sum_per_rank": [row["weight_sum"] for row in sorted(ran, key=lambda x: x["rank"])],
                "per_rank": per_rank})
        done = {s["backend"]: s for s in summary["stage2"] if s["status"] == "ran"}
        if "torch" in done and "liger" in done and done["torch"]["peak_allocated_bytes"]:
            t, l = done["torch"], done["liger"]
            summary["stage2_ratio"] = {
                "peak_change": l["peak_allocated_bytes"] / t["peak_allocated_bytes"] - 1,
                "incremental_change": l["incremental_peak_bytes"] / t["incremental_peak_bytes"] - 1,
                "final_loss_abs_diff": abs(t["final_loss"] - l["final_loss"])}
    # Liger not running is acceptable only where DeepSpeed cannot run it (CPU); on CUDA it is an error.
    if cfg["device"] == "cuda":
        for row in summary["stage1"] + summary["stage2"]:
            if row["status"] != "ran":
                summary["problems"].append(f"{row['backend']} {row['status']}")
    return summary


def render(summary: dict) -> str:
    cfg, env = summary["config"], summary["environment"]
    lines = ["## Environment", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    if "1" in cfg["stages"]:
        tp = cfg["tp"]
        where = ("world 1 (size-1 tp_group), " + ("cuda:0" if cfg["device"] == "cuda" else "cpu") if tp == 1
                 else f"TP={tp}, {summary['mode']}")
        lines += ["", f"## Stage 1: CE op alone, forward + backward, bf16, {where}",
                  "", f"local vocab {cfg['local_vocab']} per rank (global {cfg['local_vocab'] * tp}), reduction mean; "
                  f"median of {cfg['repeats']} runs after {cfg['warmup']} warm-up (rank 0, and the slowest rank); "
                  "peak allocated over one forward + backward on rank 0, input logits included; "
                  "'ran' is the path DeepSpeed was observed to call (calls counted on every rank).", "",
                  "| tokens | backend | ran | ms median | ms median, slowest rank | ms min | peak allocated GiB | "
                  "over inputs GiB | loss |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in summary["stage1"]:
            if r["status"] != "ran":
                lines.append(f"| {r['tokens']} | {r['backend']} | {r['status']} | | | | | | |")
                continue
            over = None if r["peak_allocated_bytes"] is None else r["peak_allocated_bytes"] - r["baseline_bytes"]
            ranks = f" on {len(r['calls_per_rank'])} ranks" if len(r["calls_per_rank"]) > 1 else ""
            lines.append(f"| {r['tokens']} | {r['backend']} | {r['observed']} x{r['calls'][r['observed']]}{ranks} | "
                         f"{r['ms_median']:.3f} | {r['ms_median_slowest_rank']:.3f} | {r['ms_min']:.3f} | "
                         f"{_gib(r['peak_allocated_bytes'])} | {_gib(over)} | {r['loss']:.6f} |")
        if summary["stage1_ratios"]:
            lines += ["", "| tokens | speedup torch/liger (ms) | peak liger/torch | loss abs diff |", "|---|---|---|---|"]
            for q in summary["stage1_ratios"]:
                peak = "n/a" if q["peak_liger_over_torch"] is None else f"{q['peak_liger_over_torch']:.3f}"
                lines.append(f"| {q['tokens']} | {q['speedup_torch_over_liger']:.2f}x | {peak} | "
                             f"{q['loss_abs_diff']:.3g} |")
    if "2" in cfg["stages"]:
        lines += ["", f"## Stage 2: memory profile (seed), TP={MEM_TP}, {summary['mode']}", "",
                  f"local linear + vocabulary-parallel CE fwd/bwd + {MEM_STEPS} SGD updates (lr {MEM_LR}) of "
                  f"{MEM_MICRO} micro-batches; bf16, hidden {cfg['mem_hidden']}, global vocab {cfg['mem_vocab']} "
                  f"(local {cfg['mem_vocab'] // MEM_TP}), {cfg['mem_tokens']} tokens per rank; after one warm-up "
                  "update, weights and peak stats reset; maximum across ranks.", "",
                  "| backend | ran | peak allocated bytes (MiB) | incremental peak over baseline bytes | "
                  "baseline bytes | elapsed s | final loss |", "|---|---|---|---|---|---|---|"]
        for s in summary["stage2"]:
            if s["status"] != "ran":
                lines.append(f"| {s['backend']} | {s['status']} | | | | | |")
                continue
            pk, inc = s["peak_allocated_bytes"], s["incremental_peak_bytes"]
            lines.append(f"| {s['backend']} | {s['observed']} x{s['calls_per_rank'][s['observed']]}/rank | "
                         f"{pk if pk is not None else 'n/a'} ({_mib(pk)}) | {inc if inc is not None else 'n/a'} | "
                         f"{s['baseline_bytes'] if s['baseline_bytes'] is not None else 'n/a'} | "
                         f"{s['elapsed_s']:.4f} | {s['final_loss']:.6f} |")
        q = summary["stage2_ratio"]
        if q:
            lines += ["", f"liger vs torch: peak allocated {q['peak_change']:+.1%}, incremental peak "
                      f"{q['incremental_change']:+.1%}, final loss abs diff {q['final_loss_abs_diff']:.3g}"]
    if summary["problems"]:
        lines += ["", "## PROBLEMS", ""] + [f"- {p}" for p in summary["problems"]]
    return "\n".join(lines) + "\n"


def build_config(args) -> dict:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("parity bench: --device cuda but no CUDA device is available")
    d = DEFAULTS[device]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in BACKENDS]
    if bad or not backends:
        raise SystemExit(f"parity bench: --backends must name {'/'.join(BACKENDS)}, got {args.backends!r}")
    stages = {"1": "1", "2": "2", "all": "12"}[args.stages]
    if args.tp < 1:
        raise SystemExit(f"parity bench: --tp must be >= 1, got {args.tp}")
    pick = lambda v, k: d[k] if v is None else v  # noqa: E731
    if pick(args.repeats, "repeats") < 1 or pick(args.warmup, "warmup") < 0:
        raise SystemExit("parity bench: --repeats must be >= 1 and --warmup >= 0")
    return {"device": device, "stages": stages, "backends": backends,
            "tokens": pick(args.tokens, "tokens"), "local_vocab": pick(args.local_vocab, "local_vocab"),
            "repeats": pick(args.repeats, "repeats"), "warmup": pick(args.warmup, "warmup"),
            "mem_hidden": pick(args.mem_hidden, "mem_hidden"), "mem_vocab": pick(args.mem_vocab, "mem_vocab"),
            "mem_tokens": pick(args.mem_tokens, "mem_tokens"), "mem_tp": MEM_TP, "mem_steps": MEM_STEPS,
            "mem_micro_batches": MEM_MICRO, "tp": args.tp}


def add_arguments(p) -> None:
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu (tiny sizes)")
    p.add_argument("--stages", choices=("1", "2", "all"), default="all", help="1: CE op alone; 2: memory profile")
    p.add_argument("--backends", default="torch,liger", help="comma-separated, from torch,liger")
    p.add_argument("--tp", type=int, default=1,
                   help="stage-1 tensor-parallel ranks, each holding --local-vocab columns (default 1: a size-1 group)")
    p.add_argument("--repeats", type=int, help="timed runs per stage-1 point (cuda 20, cpu 5)")
    p.add_argument("--warmup", type=int, help="untimed runs first (cuda 5, cpu 2)")
    p.add_argument("--tokens", type=int, nargs="+", help="stage-1 token counts (cuda 8192 16384, cpu 256 512)")
    p.add_argument("--local-vocab", type=int, help="stage-1 local vocabulary (cuda 16000, cpu 1024)")
    p.add_argument("--mem-hidden", type=int, help="stage-2 hidden size (cuda 128, cpu 32)")
    p.add_argument("--mem-vocab", type=int, help="stage-2 global vocabulary (cuda 65536, cpu 4096)")
    p.add_argument("--mem-tokens", type=int, help="stage-2 tokens per rank (cuda 1024, cpu 128)")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds the rank processes may take in all")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the tables as markdown")


def cmd_bench(args) -> int:
    cfg = build_config(args)
    env = environment(cfg["device"])
    print("\n".join(["## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()]), flush=True)
    world = max(cfg["tp"] if "1" in cfg["stages"] else 1, MEM_TP if "2" in cfg["stages"] else 1)
    print(f"\nspawning {world} rank process(es) on {cfg['device']} ...", flush=True)
    t0 = time.monotonic()
    try:
        results = spawn_ranks(world, cfg, args.timeout)
    except RuntimeError as exc:
        print(f"parity bench: FAILED\n{exc}", file=sys.stderr)
        return 1
    summary = summarize(cfg, env, results)
    summary["wall_s"] = time.monotonic() - t0
    text = render(summary)
    body = text.split("\n## Stage", 1)
    print(("## Stage" + body[1]) if len(body) > 1 else text, end="")
    print(f"\nbench wall time {summary['wall_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
        print(f"wrote {args.json}")
    if args.markdown:
        Path(args.markdown).write_text(text)
        print(f"wrote {args.markdown}")
    if summary["problems"]:
        print("parity bench: FAILED: " + "; ".join(summary["problems"]), file=sys.stderr)
        return 1
    return 0
