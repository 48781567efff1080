"""parity scale: the scale cases (cases/scale/*.toml) on TP rank processes, each case's stages judged
on the ranks (parity/scale/stages.py), per case and rank the wall time and the peak allocated memory.

One pair of rank processes runs every selected case in turn (DeepSpeed is imported once). Each rank
appends one JSON line per case to OUT/rank{r}.jsonl as soon as the case is done, so a run cut short
by a time limit still reports the cases it finished. Ranks are placed by parity.harness.placement:
on one GPU both ranks share cuda:0 over gloo, whose collectives on CUDA tensors go through host
memory: correct, but the times include those copies (the reports say the mode next to the times).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

GiB = float(1 << 30)


class _Deps:
    """What a scale case calls from DeepSpeed, imported once per rank process."""

    def __init__(self):
        from deepspeed.module_inject.layers import LinearLayer, VocabParallelLinear, set_autotp_mode
        from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy
        from deepspeed.sequence.linear_cross_entropy import vocab_parallel_linear_cross_entropy

        from parity.subjects.deepspeed_autotp import record_loss_backend

        set_autotp_mode(training=True)  # else AutoTP layers come out with requires_grad=False
        self.LinearLayer, self.VocabParallelLinear = LinearLayer, VocabParallelLinear
        self.vocab_parallel_cross_entropy = vocab_parallel_cross_entropy
        self.vocab_parallel_linear_cross_entropy = vocab_parallel_linear_cross_entropy
        self.record_loss_backend = record_loss_backend


def rank_main(rank: int, world: int, cases: list, port: int, out_dir: str) -> None:
    from parity.harness.rank_worker import send_output_to

    out = Path(out_dir)
    log = send_output_to(out / f"rank{rank}.log")
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        device_kind = cases[0]["device"]
        if device_kind == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import importlib

        import torch
        import torch.distributed as dist

        from parity.harness.placement import place_rank, use_placement
        from parity.scale.subjects import run_case

        placement = place_rank(rank, world, device_kind)
        use_placement(placement)
        device = torch.device(placement.device)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
        dist.init_process_group(placement.backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=300))
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # CPU-only JIT op, unused
        import deepspeed

        deepspeed.init_distributed(dist_backend=placement.backend)
        deps = _Deps()
        group = dist.new_group(list(range(world)))
        for case in cases:
            row = {"id": case["id"], "rank": rank, "mode": placement.mode, "device": str(device)}
            result = run_case(case, device, group, rank, world, deps)
            row.update(result)
            with open(out / f"rank{rank}.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        log.flush()
        os._exit(1)


def spawn(cases: list, out_dir: Path, timeout_s: float, world: int = 2) -> tuple[dict, list[str]]:
    """Runs the cases on `world` rank processes -> ({case id: [row per rank]}, problems)."""
    import torch.distributed as dist

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("rank*"):
        old.unlink()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, world, cases, store.port, str(out_dir)), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    deadline, failed_at = time.monotonic() + timeout_s, None
    while any(p.is_alive() for p in procs):
        time.sleep(0.2)
        if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
            failed_at = time.monotonic()
        now = time.monotonic()
        if now > deadline or (failed_at is not None and now > failed_at + 10):
            break
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=5)
    by_case, problems = {}, []
    for r, p in enumerate(procs):
        lines = out_dir / f"rank{r}.jsonl"
        for line in (lines.read_text().splitlines() if lines.exists() else []):
            row = json.loads(line)
            by_case.setdefault(row["id"], []).append(row)
        err = out_dir / f"rank{r}.error"
        if err.exists():
            problems.append(f"rank {r} raised:\n{err.read_text()}")
        elif p.exitcode != 0:
            why = "timed out" if p.exitcode is None or p.exitcode < 0 else f"exit code {p.exitcode}"
            log = out_dir / f"rank{r}.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            problems.append(f"rank {r} {why} (limit {timeout_s:.0f} s); log tail:\n{tail}")
    return by_case, problems


def judge(case: dict, ranks: list[dict] | None) -> dict:
    """A case passes when it ran on every rank, every stage row passed on every rank, and the CE
    backend that ran is the one DeepSpeed's gate must pick (none for the subjects with their own CE)."""
    from parity.subjects import SUBJECTS
    from parity.subjects.deepspeed_autotp import expected_ce_backend
    from parity.subjects.values import resolve

    if not ranks or len(ranks) != case["tp"]:
        return {"verdict": "failed", "why": "did not finish on every rank"}
    expected = ([expected_ce_backend(resolve(SUBJECTS["vocab_parallel"], {a: case[a] for a in ("backend", "device", "vocab",
                                                                                          "tp")}))]
                if case["subject"] == "vocab_parallel" else [])
    why = []
    for r in ranks:
        if r["facts"]["loss_backend"] != expected:
            why.append(f"rank {r['rank']}: CE backend ran {r['facts']['loss_backend']}, expected {expected}")
        if not r["rows"]:
            why.append(f"rank {r['rank']}: no stage was checked")
        why += [f"rank {r['rank']}: {s['stage']}: {s['over_bound']}/{s['checked']} over bound "
                f"(worst ratio {s['worst_ratio']:.3g})" for s in r["rows"] if not s["passed"]]
    worst = max((s["worst_ratio"] for r in ranks for s in r["rows"]), default=float("nan"))
    if case.get("plant"):
        # a planted error (tests and the scale run's planted cases) must fail its own stage
        from parity.scale.subjects import PLANTS

        failing = {s["stage"] for r in ranks for s in r["rows"] if not s["passed"]}
        caught = any(s.startswith(PLANTS[case["plant"]]) for s in failing)
        return {"verdict": "caught" if caught else "missed", "worst_ratio": worst,
                "why": f"planted {case['plant']}; failing stages: {sorted(failing) or 'none'}"}
    return {"verdict": "failed" if why else "passed", "why": "; ".join(why), "worst_ratio": worst}


def _gib(b):
    return "n/a" if b is None else f"{b / GiB:.2f}"


def render(cases: list, results: dict, env: dict, command: str) -> str:
    lines = ["## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()] + ["", f"command: `{command}`", ""]
    modes = {r["mode"] for rows in results.values() for r in rows.get("ranks") or []}
    lines += [f"rank placement: {', '.join(sorted(modes)) or 'n/a'} (gloo collectives on CUDA tensors copy through "
              "host memory: the times include those copies)", "",
              "One forward, one backward, one SGD step of one micro-batch per case. Time: the subject's "
              "step (inputs made on the device included, stage checks not); peak: "
              "torch.cuda.max_memory_allocated reset at the case start (after gc and empty_cache; what was still "
              "allocated then is listed), during the step and over the whole case (stage checks included). "
              "The first case's time includes CUDA and Triton warm-up.", "",
              "| case | verdict | worst ratio | CE ran (r0, r1) | step s r0 / r1 | allocated at start GiB r0 / r1 | "
              "step peak GiB r0 / r1 | case peak GiB r0 / r1 | checks s r0 |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        res = results[c["id"]]
        ranks = sorted(res.get("ranks") or [], key=lambda r: r["rank"])
        if res["verdict"] == "skipped":
            lines.append(f"| {c['id']} | skipped: {res['why']} | | | | | | | |")
            continue
        if not ranks:
            lines.append(f"| {c['id']} | {res['verdict']}: {res['why']} | | | | | | | |")
            continue
        t = [r["timing"] for r in ranks]
        ran = ", ".join("/".join(r["facts"]["loss_backend"]) or "-" for r in ranks)
        lines.append(f"| {c['id']} | {res['verdict']} | {res.get('worst_ratio', float('nan')):.3g} | {ran} | "
                     + " / ".join(f"{x['subject_s']:.2f}" for x in t) + " | "
                     + " / ".join(_gib(x.get("baseline_bytes")) for x in t) + " | "
                     + " / ".join(_gib(x["subject_peak_bytes"]) for x in t) + " | "
                     + " / ".join(_gib(x["case_peak_bytes"]) for x in t) + f" | {t[0]['oracle_s']:.1f} |")
    failed = [(c["id"], results[c["id"]]["verdict"], results[c["id"]]["why"]) for c in cases
              if results[c["id"]]["verdict"] in ("failed", "missed", "caught")]
    if failed:
        lines += ["", "## Failed, and planted errors (caught: the planted stage failed, as it must)", ""]
        lines += [f"- {i}: {v}: {w}" for i, v, w in failed]
    lines += ["", "## Stages (worst ratio over ranks; elements checked on rank 0)", "",
              "| case | stage | checked | over bound | worst ratio | max abs err |", "|---|---|---|---|---|---|"]
    for c in cases:
        ranks = results[c["id"]].get("ranks") or []
        if not ranks:
            continue
        for i, s in enumerate(ranks[0]["rows"]):
            worst = max(r["rows"][i]["worst_ratio"] for r in ranks)
            over = sum(r["rows"][i]["over_bound"] for r in ranks)
            lines.append(f"| {c['id']} | {s['stage']} | {s['checked']} | {over} | {worst:.3g} | {s['max_abs_err']:.3g} |")
    return "\n".join(lines) + "\n"


def environment(device: str) -> dict:
    from parity.bench import environment as bench_environment

    return bench_environment(device)


def select(cases: list, expr: str | None) -> list:
    if not expr:
        return cases
    return [c for c in cases if all(word in c["id"] for word in expr.split())]


def add_arguments(p) -> None:
    p.add_argument("--cases", metavar="FILE", help="scale case file (default cases/scale/h200.toml)")
    p.add_argument("-k", metavar="WORDS", help="only cases whose id contains every one of these words")
    p.add_argument("--shape", metavar="K=V,...", help="override tokens/vocab/hidden/samples/device (CPU rehearsal)")
    p.add_argument("--out", metavar="DIR", help="rank logs, rank*.jsonl, summary.json, summary.md (default: a temp dir)")
    p.add_argument("--timeout", type=float, default=480.0, help="seconds the rank processes may take in all")
    p.add_argument("--strict", action="store_true", help="a skipped case is a failure")


def cmd_scale(args) -> int:
    from parity.observe.capabilities import unavailable_reason
    from parity.scale import cases as scale_cases

    try:
        cases = select(scale_cases.override(scale_cases.load(args.cases), args.shape), args.k)
    except scale_cases.ScaleCaseError as exc:
        print(f"parity scale: {exc}", file=sys.stderr)
        return 2
    if not cases:
        print("parity scale: no case selected", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="parity-scale-"))
    results, runnable = {}, []
    for c in cases:
        why = unavailable_reason(["cuda"] if c["device"] == "cuda" else [])
        if why:
            results[c["id"]] = {"verdict": "skipped", "why": why}
        else:
            runnable.append(c)
    worlds = {c["tp"] for c in runnable}
    devices = {c["device"] for c in runnable}
    if len(worlds) > 1 or len(devices) > 1:
        print(f"parity scale: one run takes one TP size and one device, got {sorted(worlds)} {sorted(devices)}",
              file=sys.stderr)
        return 2
    problems = []
    if runnable:
        print(f"running {len(runnable)} scale case(s) on {runnable[0]['tp']} ranks ({runnable[0]['device']}); "
              f"rank logs in {out}", flush=True)
        by_case, problems = spawn(runnable, out, args.timeout, world=runnable[0]["tp"])
        for c in runnable:
            ranks = by_case.get(c["id"])
            results[c["id"]] = {**judge(c, ranks), "ranks": ranks}
    env = environment(devices.pop() if devices else "cpu")
    command = "parity scale " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "parity scale"
    text = render(cases, results, env, command)
    if problems:
        text += "\n## Rank problems\n\n" + "\n".join(f"```\n{p}\n```" for p in problems) + "\n"
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"environment": env, "cases": cases, "results": results},
                                                 indent=1, default=str))
    print(text)
    counts = {}
    for r in results.values():
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    print(", ".join(f"{n} {v}" for v, n in sorted(counts.items())) + f"; summary in {out}/summary.md")
    bad = counts.get("failed", 0) or counts.get("missed", 0) or problems or (args.strict and counts.get("skipped", 0))
    return 1 if bad else 0
