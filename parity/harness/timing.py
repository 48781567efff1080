"""Where a case's wall time goes (parity run --profile): seconds by phase, measured, never estimated.

The phases of one case, as the parent sees them (they add up to the case's wall time):
  rank_start  spawning a rank group (first case of a group, or after a group was torn down)
  ipc         the task's trip to the rank whose result came last, and that result's trip back
              (mp.Queue pickles in a feeder thread and unpickles on get: both count here)
  rank_work   that rank's run of the case (run_case, timed inside the rank)
  waiting     the rest of the time the parent waited on its ranks (after the last result: the
              bookkeeping of a lost rank, a torn-down group)
  reference   the parent blocked on the unsharded reference (what rank work did not hide)
  comparison  the checks (parity.checks.compare)
  other       everything else: the skip test, judging, the verdict's bookkeeping
reference_compute is not a phase: it is how long the reference took where it ran (overlapped with
rank work in a thread, or 0 on a cache hit), so reference_compute - reference is what overlap saved.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

PHASES = ("rank_start", "ipc", "rank_work", "waiting", "reference", "comparison", "other")


def pool_phases(start_s: float, sent: float, stamps: dict, finished: float) -> dict:
    """One RankPool.run: start_s spent starting the group, tasks sent at `sent`, returned at
    `finished`; stamps: rank -> ({"received", "done"} monotonic stamps of the rank, when the parent
    had that rank's result). The case's critical path is the rank whose result came last: its
    task's trip and its result's trip are ipc, its run is rank_work (waits on its peers inside
    collectives included), what is left is waiting. A rank lost to a crash or hang sent no stamp."""
    timing = {"rank_start": start_s}
    ranks = [(s, got) for s, got in stamps.values() if s]
    if not ranks:
        timing["waiting"] = finished - sent
        return timing
    last, got = max(ranks, key=lambda r: r[1])
    timing.update(ipc=(last["received"] - sent) + (got - last["done"]), rank_work=last["done"] - last["received"],
                  waiting=finished - got)
    return timing


@contextmanager
def phase(timing: dict | None, name: str):
    """Add the time spent in the block to timing[name] (no-op when timing is None)."""
    start = time.monotonic()
    try:
        yield
    finally:
        if timing is not None:
            timing[name] = timing.get(name, 0.0) + time.monotonic() - start


def close_case(timing: dict, wall_s: float) -> dict:
    """The phases of one case, `other` being what the measured ones leave of its wall time."""
    out = {p: round(timing.get(p, 0.0), 6) for p in PHASES if p != "other"}
    out["other"] = round(max(0.0, wall_s - sum(out.values())), 6)
    out["reference_compute"] = round(timing.get("reference_compute", 0.0), 6)
    out["wall"] = round(wall_s, 6)
    return out


def occupancy(spans, clock: dict, jobs: int, cores: int) -> dict:
    """With -j N: how much of the run the jobs and the cores had work. spans: (job id, world size,
    cases, sent, answered[, subject]) per batch; clock: monotonic "created" (the job pool was made) and "probed"
    (the capabilities were known, the jobs about to start). A phase summed over cases cannot show
    this: a run is slow where jobs sit idle (waiting to start, or for the last batches) as much as
    where a case is slow."""
    if not spans:
        return {}
    start, first, last = clock["created"], min(s[3] for s in spans), max(s[4] for s in spans)
    span_s = max(last - start, 1e-9)
    busy_job_s = sum(s[4] - s[3] for s in spans)
    busy_rank_s = sum(s[1] * (s[4] - s[3]) for s in spans)
    # The tail: nothing left to send, the jobs finishing what they hold.
    tail = last - max(s[3] for s in spans)
    return {"jobs": jobs, "cores": cores, "batches": len(spans),
            "probing_s": round(clock.get("probed", start) - start, 3),
            "first_batch_sent_s": round(first - start, 3), "last_answer_s": round(last - start, 3),
            "jobs_busy_mean": round(busy_job_s / span_s, 2), "ranks_busy_mean": round(busy_rank_s / span_s, 2),
            "last_batch_s": round(tail, 3),
            # [seconds, cases, world size, subject, sent at (seconds from the pool's creation)]: where a long
            # batch went late, it is the tail
            "largest_batches": sorted(([round(s[4] - s[3], 2), s[2], s[1], s[5] if len(s) > 5 else "",
                                        round(s[3] - start, 1)] for s in spans), reverse=True)[:8]}
