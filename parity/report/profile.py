"""parity run --profile: where the run's time went, from the verdicts' phases (parity.harness.timing)
and the report writer's, as a table to print and profile.json / profile.md beside the report."""
from __future__ import annotations

import json
from pathlib import Path

from parity.harness.timing import PHASES
from parity.report.markdown import table

COLUMNS = (*PHASES, "wall", "reference_compute")


def case_rows(verdicts) -> list[dict]:
    return [{"id": v.case.id, "subject": v.case.subject, "verdict": v.status, **v.timing} for v in verdicts]


def _totals(rows) -> dict:
    return {c: round(sum(r.get(c, 0.0) for r in rows), 3) for c in COLUMNS}


def profile(verdicts, wall_s: float, jobs: int, report: dict | None = None, cache: dict | None = None,
            occupied: dict | None = None) -> dict:
    """The whole run's profile: per-phase totals (overall and per subject), every case's phases, the
    report writer's phases, the reference cache's hits and misses, and with -j N the jobs' occupancy."""
    rows = case_rows(verdicts)
    subjects = sorted({r["subject"] for r in rows})
    return {"wall_seconds": round(wall_s, 3), "jobs": jobs, "cases": len(rows), "totals": _totals(rows),
            "by_subject": {s: {"cases": sum(r["subject"] == s for r in rows),
                               **_totals([r for r in rows if r["subject"] == s])} for s in subjects},
            "report": {k: round(v, 3) for k, v in (report or {}).items()},
            "reference_cache": dict(cache or {}), "occupancy": dict(occupied or {}), "per_case": rows}


def profile_markdown(prof: dict) -> str:
    totals = prof["totals"]
    summed = totals["wall"] or 1.0
    lines = [f"# parity run --profile: {prof['cases']} cases, {prof['jobs']} at once, {prof['wall_seconds']:.1f} s wall",
             "", "Seconds summed over cases (with -j N they overlap, so the sum exceeds the wall time); "
             "phases are defined in parity/harness/timing.py. reference_compute is where the reference "
             "ran, overlapped with rank work; reference is what the parent still waited for.", ""]
    lines += table(("phase", "seconds", "share of case time"),
                   [(c, f"{totals[c]:.2f}", f"{100 * totals[c] / summed:.1f}%") for c in PHASES]
                   + [("wall (sum of cases)", f"{summed:.2f}", "100%"),
                      ("reference_compute", f"{totals['reference_compute']:.2f}", "")])
    lines += ["", "## By subject", ""]
    lines += table(("subject", "cases", *COLUMNS),
                   [(s, t["cases"], *(f"{t[c]:.2f}" for c in COLUMNS)) for s, t in prof["by_subject"].items()])
    cache = prof.get("reference_cache") or {}
    if cache:
        lines += ["", f"Reference cache: {cache.get('hits', 0)} hits, {cache.get('misses', 0)} misses."
                  + (f" On disk (--reference-cache): {cache['disk_hits']} of the misses read, {cache['disk_writes']} "
                     f"written, {cache['disk_unreadable']} unreadable and computed again." if "disk_hits" in cache else "")]
    occupied = prof.get("occupancy") or {}
    if occupied:
        lines += ["", "## Occupancy (-j)", "",
                  f"{occupied['jobs']} jobs on {occupied['cores']} cores, {occupied['batches']} batches. From the job "
                  f"pool's creation: capabilities probed at {occupied['probing_s']:.1f} s, first batch sent at "
                  f"{occupied['first_batch_sent_s']:.1f} s, last answered at {occupied['last_answer_s']:.1f} s, "
                  f"{occupied['last_batch_s']:.1f} s after the last batch was sent. On average {occupied['jobs_busy_mean']:.2f} "
                  f"jobs held a batch and {occupied['ranks_busy_mean']:.2f} ranks were running. Longest batches "
                  "(seconds, cases, world size): "
                  + ", ".join(f"{b[0]:.1f} s x {b[1]} @ {b[2]}" + (f" ({b[3]}, sent at {b[4]:.1f} s)" if len(b) > 3 else "")
                              for b in occupied["largest_batches"]) + "."]
    if prof["report"]:
        lines += ["", "## Writing the report", ""]
        lines += table(("part", "seconds"), [(k, f"{v:.2f}") for k, v in prof["report"].items()]
                       + [("total", f"{sum(prof['report'].values()):.2f}")])
    return "\n".join(lines) + "\n"


def write_profile(directory, prof: dict) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "profile.json").write_text(json.dumps(prof, indent=1))
    (directory / "profile.md").write_text(profile_markdown(prof))
