"""A group of spawned rank processes that runs many cases, one after another.

Starting a rank group costs seconds (spawn, imports, process group); running a case in a warm
group costs a fraction of one. A case whose ranks raise, die or hang becomes a RankFailure with
each rank's traceback (a hung rank's stack is dumped with faulthandler); the group is then torn
down and the next case gets a fresh one.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from parity.harness.rank_worker import rank_main
from parity.harness.timing import pool_phases

START_TIMEOUT_S = 300
# After one rank fails, how long its peers get to fail too before they are presumed stuck in a
# collective the failed rank will never join.
PEER_GRACE_S = 10.0


@dataclass
class RankError:
    rank: int
    type: str
    message: str
    traceback: str
    # What the rank recorded on its way out (parity_facts on the exception), e.g. the model's state
    # before and after a refused setup; empty when the exception carried none.
    facts: dict = field(default_factory=dict)


@dataclass
class PoolOutcome:
    observations: dict = field(default_factory=dict)  # rank -> RankObservations
    errors: dict = field(default_factory=dict)  # rank -> RankError
    broken: bool = False  # the group had to be torn down (death, hang, or peers stuck after an error)
    timing: dict = field(default_factory=dict)  # seconds by phase (parity.harness.timing.pool_phases)

    @property
    def complete(self) -> bool:
        return not self.errors and not self.broken


class PoolStartError(RuntimeError):
    pass


def _tail(path: Path, offset: int, limit: int = 6000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    return text[-limit:]


class RankPool:
    def __init__(self, world_size: int, device: str = "cpu", log_dir: str | None = None):
        self.world_size = world_size
        self.device = device
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="parity-ranks-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list = []
        self.seq = 0
        self.generation = 0
        self.mode = ""  # as the ranks reported it, e.g. "2 ranks sharing cuda:0 over gloo"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        import torch.distributed as dist

        self.generation += 1
        ctx = mp.get_context("spawn")
        # port 0: the OS picks a free port and this process keeps it bound for the pool's life.
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(self.world_size)]
        self.logs = [self.log_dir / f"w{self.world_size}-g{self.generation}-rank{r}.log"
                     for r in range(self.world_size)]
        self.procs = [ctx.Process(target=rank_main, daemon=True,
                                  args=(r, self.world_size, self.device, self.store.port, self.tasks[r],
                                        self.results, str(self.logs[r])))
                      for r in range(self.world_size)]
        for p in self.procs:
            p.start()
        ready, deadline = set(), time.monotonic() + START_TIMEOUT_S
        while len(ready) < self.world_size:
            try:
                kind, rank, _, mode, _ = self.results.get(timeout=0.5)
                ready.add(rank)
                self.mode = mode
                continue
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                why = f"rank {dead[0]} exited with code {self.procs[dead[0]].exitcode}" if dead else "start timed out"
                if dead and all(_tail(log, 0) == "" for log in self.logs):
                    # Spawn re-imports the parent's modules before rank_main opens its log, so an
                    # import error lands on the parent's stderr, not in the rank log.
                    why += " before opening its log (an import error? see the traceback printed above)"
                detail = "\n".join(f"--- rank {r} log ---\n{_tail(self.logs[r], 0)}" for r in range(self.world_size))
                self.close(force=True)
                raise PoolStartError(f"rank group of {self.world_size} failed to start: {why}\n{detail}")

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def close(self, force: bool = False) -> None:
        if not self.procs:
            return
        # A spawn that failed part way (an import error in the parent's __main__) leaves
        # processes that never started: there is nothing to join or kill for those.
        started = [p for p in self.procs if p.pid is not None]
        if not force:
            for q in self.tasks:
                q.put(None)
            for p in started:
                p.join(timeout=10)
        for p in started:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        if force:  # no rank will read what is queued; exit must not wait on a feeder thread for it (Ctrl-C mid-put)
            for q in self.tasks:
                q.cancel_join_thread()
        self.procs = []
        self.store = None

    # -- running a case ----------------------------------------------------------------------
    def run(self, subject: str, values: dict, timeout_s: float) -> PoolOutcome:
        start_s = 0.0
        if not self.alive:
            begun = time.monotonic()
            self.close(force=True)
            self.start()
            start_s = time.monotonic() - begun
        self.seq += 1
        sent = time.monotonic()
        stamps = {}  # rank -> (the rank's received/done stamps, when this process had its result)
        offsets = [os.path.getsize(p) if p.exists() else 0 for p in self.logs]
        for q in self.tasks:
            q.put((self.seq, subject, values))
        outcome = PoolOutcome()
        deadline = time.monotonic() + timeout_s
        first_error_at = None
        problem = None
        while len(outcome.observations) + len(outcome.errors) < self.world_size:
            try:
                kind, rank, seq, payload, stamp = self.results.get(timeout=0.2)
            except queue.Empty:
                now = time.monotonic()
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                if dead:
                    problem = {r: f"rank {r} died (exit code {self.procs[r].exitcode})" for r in dead}
                elif now > deadline:
                    problem = {None: f"no result within {timeout_s:.0f} s"}
                elif first_error_at is not None and now > first_error_at + PEER_GRACE_S:
                    problem = {None: f"still running {PEER_GRACE_S:.0f} s after a peer failed (stuck in a collective?)"}
                if problem:
                    break
                continue
            if seq != self.seq:
                continue
            stamps[rank] = (stamp, time.monotonic())
            if kind == "ok":
                outcome.observations[rank] = payload
            else:
                outcome.errors[rank] = RankError(rank, payload["type"], payload["message"], payload["traceback"],
                                                 payload.get("facts") or {})
                first_error_at = first_error_at or time.monotonic()
        if problem:
            missing = [r for r in range(self.world_size) if r not in outcome.observations and r not in outcome.errors]
            for r in missing:
                if self.procs[r].is_alive():
                    os.kill(self.procs[r].pid, signal.SIGUSR1)  # faulthandler writes the stack to the log
            time.sleep(1.0)
            for r in missing:
                why = problem.get(r) or problem.get(None)
                outcome.errors[r] = RankError(r, "RankLost", why,
                                              f"{why}; last output of rank {r} (log {self.logs[r]}):\n"
                                              f"{_tail(self.logs[r], offsets[r])}")
            outcome.broken = True
            self.close(force=True)
        outcome.timing = pool_phases(start_s, sent, stamps, time.monotonic())
        return outcome
