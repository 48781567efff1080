"""Progress lines while running, the summary table at the end, and the report directory:
summary.json, results.jsonl, summary.md and report.html, all written from verdict dicts."""
from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

from parity.checks.verdict import DIVERGED, FAILED, FIXED, PASSED, SKIPPED, STATUSES, XPASSED


class Progress:
    def __init__(self, total: int, stream=None):
        # sys.stdout as it is now (a default bound at import would be the stream of whoever imported first: a
        # second in-process run under pytest's capture wrote to the first test's closed one).
        self.total, self.done, self.stream = total, 0, stream or sys.stdout
        self.start = time.monotonic()
        self.counts = Counter()

    def update(self, verdict) -> None:
        self.done += 1
        self.counts[verdict.status] += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        width = len(str(self.total))
        print(f"[{self.done:>{width}}/{self.total}] {verdict.status.upper():7} {verdict.seconds:6.2f}s "
              f"{verdict.case.id}  (eta {eta:4.0f}s)", file=self.stream, flush=True)
        if verdict.status == FAILED:
            print(verdict.explain(), file=self.stream, flush=True)
        elif verdict.status in (SKIPPED, DIVERGED, XPASSED):
            print(f"    {verdict.status}: {verdict.reason}", file=self.stream, flush=True)


def summary_table(verdicts, wall_s: float, not_run=()) -> str:
    """not_run: {"id", "reason"} for selected cases this launch could not run (torchrun: another world size)."""
    from parity.report.records import counts_by_subject

    counts = Counter(v.status for v in verdicts)
    rows = [("subject", "cases") + STATUSES]
    rows += counts_by_subject([{"subject": v.case.subject, "verdict": v.status} for v in verdicts])
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(w) if i == 0 else str(cell).rjust(w) for i, (cell, w) in
                       enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(-1, "-" * len(lines[0]))
    skipped = Counter(v.reason for v in verdicts if v.status == SKIPPED)
    if skipped:
        lines.append("skipped, by reason:")
        lines.extend(f"  {n:4d}  {reason}" for reason, n in skipped.most_common())
    diverged = Counter((v.case.divergence.reason, v.case.divergence.repro) for v in verdicts if v.status == DIVERGED)
    if diverged:
        lines.append("known divergences (the subject differs from the reference as documented):")
        lines.extend(f"  {n:4d}  {reason}\n        repro: {repro}" for (reason, repro), n in diverged.most_common())
    fixed = Counter(name for v in verdicts for name, status in v.findings.items() if status == FIXED)
    if fixed:
        lines.append("findings fixed (a case's mark whose checks now pass; the case may still diverge on another):")
        lines.extend(f"  {n:4d}  {name}" for name, n in fixed.most_common())
    xpassed = [v for v in verdicts if v.status == XPASSED]
    if xpassed:
        lines.append("known divergences that now MATCH the reference (remove their marks):")
        lines.extend(f"  {v.case.id}" for v in xpassed)
    failed = [v for v in verdicts if v.status == FAILED]
    if failed:
        lines.append("failed (reproduce each with the command shown):")
        lines.extend(f"  {v.case.id}: {v.first_failure}\n    {v.repro()}" for v in failed)
    modes = Counter(v.mode for v in verdicts if v.mode)
    if modes:
        lines.append("ranks ran as: " + "; ".join(f"{mode} ({n} cases)" for mode, n in sorted(modes.items())))
    ratios = [v.worst_ratio for v in verdicts if v.worst_ratio is not None and v.status == PASSED]
    if ratios:
        lines.append(f"closest numerical check of a passing case: {max(ratios):.3f} of its bound")
    if not_run:
        lines.append("not run under this launch, by reason:")
        lines.extend(f"  {n:4d}  {reason}" for reason, n in Counter(c["reason"] for c in not_run).most_common())
    extra = "".join(f", {counts[s]} {s}" for s in (DIVERGED, XPASSED) if counts[s])
    extra += f", {len(not_run)} not run" if not_run else ""
    lines.append(f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[SKIPPED]} skipped{extra} "
                 f"in {wall_s:.1f} s")
    return "\n".join(lines)


def environment(packages: dict, machine: dict, suite: dict) -> dict:
    """The flat table summary.md and report.html show; summary.json keeps the detail beside it."""
    info = {"python": platform.python_version(), "machine": platform.machine(), **{
        name: p["version"] + ("" if p.get("from_installed_distribution", True) else f" (from {p['path']})")
        + (f" git {p['git']['commit'][:12]}{' dirty' if p['git']['dirty'] else ''}" if p.get("git") else "")
        if p["version"] else None for name, p in packages.items()}}
    info.update({k: machine[k] for k in ("cpu_model", "cpu_count", "gpu_count", "gpu_name", "cuda", "nccl")})
    git = suite.get("git")
    info["suite_commit"] = git and git["commit"][:12] + (" dirty" if git["dirty"] else "")
    return info


def case_summary(record: dict) -> dict:
    """A case as summary.json keeps it: the verdict dict without its per-check list (results.jsonl
    has that), plus where its worst ratio and first divergence were."""
    from parity.report.records import first_divergence, worst_check

    slim = {k: v for k, v in record.items() if k != "check_results"}
    worst, first = worst_check(record), first_divergence(record)
    slim["worst_check"] = None if worst is None else {k: worst.get(k) for k in ("name", "step", "micro", "rank")}
    slim["first_divergence"] = None if first is None else first
    return slim


def gather_environment() -> tuple:
    """(packages, machine, suite, capabilities, capability facts) for summary.json: git and probe
    child processes of seconds, which parity run has made in a thread while its cases run."""
    from parity.observe import capabilities
    from parity.report import environment as env

    return env.packages(), env.machine(), env.suite(), capabilities.snapshot(), capabilities.facts()


def write_report(directory, records: list[dict], wall_s: float, argv: list[str] | None = None, not_run=(),
                 launcher: str | None = None, interrupted: bool = False, timing: dict | None = None,
                 gathered: tuple | None = None, workers: int | None = None,
                 results_texts: list[str] | None = None) -> None:
    """Write DIR/summary.json, results.jsonl, summary.md and report.html from verdict dicts
    (Verdict.as_dict()), whichever process produced them. not_run: {"id", "reason"} of selected
    cases this launch could not run (torchrun: another world size; -x; Ctrl-C); launcher: set when
    not spawn; interrupted: the run was stopped by Ctrl-C, so the report is partial; timing: where
    the seconds of each part are added (parity run --profile; as this process spent them, waiting
    for a worker included); gathered: gather_environment()'s answer when the caller had it made
    while the cases ran; workers: processes that write results.jsonl and draw report.html's
    figures meanwhile (None: parity.report.workers.default_workers(); 0: all done here, in turn);
    results_texts: each record's lines of results.jsonl, already made while the cases ran
    (parity.report.stream). The files are the same bytes either way."""
    from parity.harness.timing import phase
    from parity.report.html import figure_parts, gather_figures, report_html
    from parity.report.plots import preload
    from parity.report.workers import Parts, default_workers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    workers = default_workers() if workers is None else workers
    if workers:
        preload()
    with Parts(records, workers) as parts:
        # results.jsonl first (the longest part), then the case figures in small parts that
        # whichever worker is free takes: two per worker keeps them all busy to about the end.
        # Lines the stream already made only need writing out.
        results = None if results_texts is not None else parts.submit(write_results, str(directory / "results.jsonl"))
        figures = [(name, parts.submit(task, *args)) for name, task, args in figure_parts(records, 2 * max(1, workers))]
        run = _write_summaries(directory, records, wall_s, argv, not_run, launcher, interrupted, timing, gathered)
        with phase(timing, "results.jsonl"):
            if results is None:
                with open(directory / "results.jsonl", "w") as out:
                    out.writelines(results_texts)
            else:
                results.result()
        with phase(timing, "figures"):
            drawn = gather_figures([(name, part.result()) for name, part in figures])
    with phase(timing, "report.html"):
        (directory / "report.html").write_text(report_html(records, run, drawn))


def write_results(records: list[dict], path: str) -> int:
    """results.jsonl (a report part: parity.report.workers); returns how many lines it wrote."""
    from parity.report.stream import encoder, results_text

    encode, lines = encoder(), 0
    with open(path, "w") as out:
        for record in records:
            text = results_text(record, encode)
            out.write(text)
            lines += text.count("\n")
    return lines


def _write_summaries(directory, records, wall_s, argv, not_run, launcher, interrupted, timing, gathered) -> dict:
    """summary.json and summary.md; returns the run's facts, for report.html."""
    from parity.harness.timing import phase
    from parity.report import environment as env
    from parity.report.markdown import summary_markdown

    counts = Counter(r["verdict"] for r in records)
    with phase(timing, "environment"):
        packages, machine, suite, capability_snapshot, capability_facts = gathered or gather_environment()
    run = {"schema_version": env.SCHEMA_VERSION,
           "command": shlex.join(argv if argv is not None else sys.argv), "wall_seconds": round(wall_s, 2),
           "environment": environment(packages, machine, suite),
           "packages": packages, "machine": machine, "suite": suite,
           "capabilities": capability_snapshot, "capability_facts": capability_facts,
           "counts": {"total": len(records), **{status: counts[status] for status in STATUSES}}}
    if launcher:
        run["launcher"] = launcher
    if interrupted:
        run["interrupted"] = True
    if not_run:
        run["not_run"] = list(not_run)
    with phase(timing, "summary.json"):
        (directory / "summary.json").write_text(
            json.dumps({**run, "cases": [case_summary(r) for r in records]}, indent=1, default=str))
    with phase(timing, "summary.md"):
        (directory / "summary.md").write_text(summary_markdown(records, run))
    return run
