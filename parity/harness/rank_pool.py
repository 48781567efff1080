"""A group of rank processes that runs many cases, one after another.

Starting a rank group costs seconds (imports, process group); running a case in a warm group costs
a fraction of one. A case whose ranks raise, die or hang becomes a RankFailure with each rank's
traceback (a hung rank's stack is dumped with faulthandler); the group is then torn down and the
next case gets a fresh one.

Ranks are forked from a forkserver that imported torch once (start_context), not spawned: spawning
re-imports torch in every rank, and torch.use_deterministic_algorithms imports TorchDynamo and
Inductor (1.8 s per rank on the 2-core EPYC). A group of two then started in about 3 s, and the
default matrix starts a group 20 times on that machine (12 of them after a stuck peer, below).
"spawn" stays selectable (parity run --baseline, the benchmark's old harness).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import re
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from parity.harness.rank_worker import CPU_RANK_ENV, rank_main
from parity.harness.timing import pool_phases
from parity.settings import RunSettings

START_TIMEOUT_S = 300
# After one rank fails, how long its peers get to fail too before they are presumed stuck in a
# collective the failed rank will never join.
PEER_GRACE_S = 10.0
# ...unless they are released first: RELEASE_AFTER_S after a rank failed with peers still out, the
# ranks that already answered are stopped. A peer waiting on one of them in a gloo collective gets
# "Connection closed by peer" at once and reports it (a RankLost, with the stack of the collective
# it was in); a peer busy elsewhere is unaffected and answers as it would have. Stopping a rank only
# touches ranks that need it, and those would have waited the whole grace: the verdict is the same,
# about 9 s sooner (12 such cases in the default CPU matrix). The window lets a peer read what the
# failed rank sent before failing, and lets ranks that all fail alike (a rejection) keep their group.
RELEASE_AFTER_S = 2.0
# How a released peer's error reads: gloo's TCP transport when the other end of a pair went away.
# Under TORCH_DISTRIBUTED_DEBUG=DETAIL every collective first passes a monitored barrier, which names the
# peers that are gone instead (explore seed 1 met it: the dist_debug axis with a crash on another rank).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "failed to pass monitoredBarrier")

# Imported once by the forkserver, so a forked rank has them. The forkserver is made for the device
# of the first group this process starts. For CPU ranks it starts with a CPU rank's environment
# (Triton's interpreter must be chosen before triton is imported, and torch's Inductor, which
# use_deterministic_algorithms imports, imports triton) and also preloads Inductor; a later CUDA
# group then spawns its ranks. Made for CUDA ranks it preloads only what is device-neutral, for
# either: importing DeepSpeed there would pick a CUDA accelerator in the forkserver. For CPU ranks it
# also imports the frameworks (parity/harness/cpu_rank_preload.py says why that is safe). Inductor is
# preloaded even where a rank could set the deterministic flags without importing it: the ranks import
# it anyway while they run the cases (DeepSpeed and Liger's paths), and on the H200 host's 16 cores a
# forkserver without it doubled the summed rank work of the default matrix, 282 -> 578 s, and its wall,
# 74 -> 130 s (results/perf/h200-16-cores-r9/).
NEUTRAL_PRELOAD = ["torch", "torch.distributed", "parity.harness.rank_worker"]
CPU_PRELOAD = ["torch._inductor.config", "torch._inductor.compile_fx", "parity.harness.cpu_rank_preload"]
_forkserver_device: str | None = None  # the device the forkserver was made for, once started


def start_context(method: str, device: str):
    """The multiprocessing context a group of ranks on `device` starts from."""
    global _forkserver_device
    if method != "forkserver" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    if _forkserver_device is None:
        from multiprocessing import forkserver

        cpu = device == "cpu"
        env = dict(CPU_RANK_ENV) if cpu else {}
        ctx.set_forkserver_preload(NEUTRAL_PRELOAD + (CPU_PRELOAD if cpu else []))
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the forkserver's environment is this process's when it starts
        try:
            forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _forkserver_device = "cpu" if cpu else "any"
    if _forkserver_device == "cpu" and device != "cpu":
        return mp.get_context("spawn")
    return ctx


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


def _fatal_cause(log_tail: str) -> str:
    """Why a rank process died, from what it wrote last: a C++ exception that reached std::terminate (its type
    and what(): gloo's "collective mismatch" enforce, say), else Python's fatal error line; "" if neither."""
    thrown = re.search(r"terminate called after throwing an instance of '([^']+)'", log_tail)
    what = re.search(r"^\s*what\(\):\s*(.+)$", log_tail, re.MULTILINE)
    if what:
        return f"{thrown.group(1)}: {what.group(1).strip()}" if thrown else what.group(1).strip()
    fatal = re.search(r"^Fatal Python error: (.+)$", log_tail, re.MULTILINE)
    return fatal.group(1).strip() if fatal else ""


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
    def __init__(self, world_size: int, device: str = "cpu", log_dir: str | None = None,
                 start_method: str = "forkserver", release_stuck_peers: bool = True,
                 settings: RunSettings | None = None):
        self.world_size = world_size
        # The run's settings, handed to every rank this pool starts (rank_main).
        self.settings = settings if settings is not None else RunSettings.from_env()
        self.start_method = start_method
        self.release_stuck_peers = release_stuck_peers
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
        ctx = start_context(self.start_method, self.device)
        # port 0: the OS picks a free port and this process keeps it bound for the pool's life.
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(self.world_size)]
        self.logs = [self.log_dir / f"w{self.world_size}-g{self.generation}-rank{r}.log"
                     for r in range(self.world_size)]
        self.procs = [ctx.Process(target=rank_main, daemon=True,
                                  args=(r, self.world_size, self.device, self.store.port, self.tasks[r],
                                        self.results, str(self.logs[r]), self.settings.rank_environ(os.environ),
                                        os.getpid(), self.settings.as_dict()))
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
    def run(self, subject: str, values: dict, timeout_s: float, cancelled=None) -> PoolOutcome:
        """cancelled: a callable, true once the caller no longer wants this case (its runner closed while
        the case was on its way here): the group is not started for it and the wait ends within 0.2 s."""
        start_s = 0.0
        if cancelled is not None and cancelled():
            return PoolOutcome(broken=True)
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
        released: list = []  # ranks stopped to release their peers, in order
        released_at = None
        while len(outcome.observations) + len(outcome.errors) < self.world_size:
            try:
                kind, rank, seq, payload, stamp = self.results.get(timeout=0.2)
            except queue.Empty:
                if not self.procs or (cancelled is not None and cancelled()):  # closed meanwhile (Ctrl-C, -x)
                    outcome.broken = True
                    return outcome
                now = time.monotonic()
                answered = [r for r in (*outcome.observations, *outcome.errors) if r not in released]
                if (self.release_stuck_peers and first_error_at is not None and answered
                        and now > (released_at or first_error_at) + RELEASE_AFTER_S):
                    for r in sorted(answered):
                        self.procs[r].kill()
                        self.procs[r].join(timeout=5)
                    released += sorted(answered)
                    released_at = now
                    continue
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive() and r not in released]
                if dead:
                    problem = {r: f"died (exit code {self.procs[r].exitcode})" for r in dead}
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
            elif released and any(gone in payload["message"] for gone in _PEER_GONE):
                why = (f"still running after a peer failed: stuck in a collective with rank(s) "
                       f"{', '.join(map(str, released))}, released when the parent stopped them")
                outcome.errors[rank] = RankError(rank, "RankLost", why,
                                                 f"{why}; then it raised {payload['type']}: {payload['message']}\n"
                                                 f"{payload['traceback']}")
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
            dead = [r for r in missing if r in problem]
            for r in missing:
                tail = _tail(self.logs[r], offsets[r])
                if r in dead:
                    # A rank that died is a cause, not a lost peer: its reason says what killed it (a gloo abort
                    # on a collective mismatch reads "died (exit code -6) after gloo::EnforceNotMet: ...").
                    cause = _fatal_cause(tail)
                    why = problem[r] + (f" after {cause}" if cause else "")
                    kind = "RankDied"
                else:
                    why = problem.get(None) or f"still running when rank(s) {', '.join(map(str, dead))} died"
                    kind = "RankLost"
                outcome.errors[r] = RankError(r, kind, why, f"{why}; last output of rank {r} (log {self.logs[r]}):\n"
                                                            f"{tail}")
            if dead:
                # A peer that already reported the dead rank's closed connection was lost to it, not a cause.
                for r, err in list(outcome.errors.items()):
                    if err.type not in ("RankDied", "RankLost") and any(g in err.message for g in _PEER_GONE):
                        why = f"lost its peer: rank(s) {', '.join(map(str, dead))} died"
                        outcome.errors[r] = RankError(r, "RankLost", why, f"{why}; it raised {err.type}: "
                                                                          f"{err.message}\n{err.traceback}")
            outcome.broken = True
            self.close(force=True)
        elif released:  # the stopped ranks leave the group short: the next case starts a new one
            outcome.broken = True
            self.close(force=True)
        outcome.timing = pool_phases(start_s, sent, stamps, time.monotonic())
        return outcome
