"""Cases -> rank groups -> observations -> comparison -> verdicts."""
from __future__ import annotations

import os
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from parity.matrix.cases import Case
from parity.checks.compare import Check, ReferenceCache, compare, reference_pair, state_after_rejection_checks
from parity.checks.one_thread import one_torch_thread
from parity.harness.rank_pool import PoolStartError, RankPool
from parity.harness.timing import close_case, phase
from parity.subjects import SUBJECTS
from parity.checks.verdict import DIVERGED, FAILED, FIXED, PASSED, PRESENT, SKIPPED, XPASSED, Verdict, repro_env
from parity.settings import DEFAULT_CASE_TIMEOUT_S, RunSettings

# Rank processes one Runner keeps alive across its rank groups (one group per world size and device).
# A CPU rank holds torch, DeepSpeed, transformers and Megatron: measured 420 MB resident (260 MB of
# it its own) per rank with torch 2.13. Keeping every group of the default matrix warm (world sizes
# 2, 3, 4, 5, 6, 8: 28 ranks) held 11.7 GB per Runner, 23 GB under `pytest -n 2`: at CI's 24 GiB the
# kernel evicted the ranks' own code pages and the whole suite crawled (a one-case subprocess took
# 140 s, load average 227 on 2 cores). 12 keeps the usual 2-, 3- and 4-rank groups warm together and
# closes the least recently used ones for a larger group; about 5 GB per Runner.
DEFAULT_MAX_LIVE_RANKS = 12


# One thread of the parent at a time runs a subject's code: its references (the reference thread) and the
# comparison that builds its claims and reruns its reference under rounding noise (the judge thread). A
# library's model load swaps process globals for its duration with save-and-restore context managers
# (transformers' from_pretrained: torch's default dtype, PreTrainedModel.tie_weights, torch's init
# functions); two loads interleaved in two threads restore each other's replacements and leave them in
# place (findings/transformers_from_pretrained_threads_leave_globals.toml). Ranks still overlap both.
SUBJECT_CODE = threading.RLock()


# A job process holds up to DEFAULT_MAX_LIVE_RANKS ranks of about 420 MB each, plus its own
# references: budget this much available memory per job, so -j's default never swaps.
JOB_MEMORY_BYTES = 6 << 30


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_jobs(cases) -> int:
    """As many job processes as the cores can feed, at the selection's smallest world size (the
    dispatcher still keeps the busy ranks within the cores), and as the available memory holds."""
    import psutil

    smallest = min((c.world_size for c in cases), default=1)
    jobs = min(available_cores() // max(1, smallest), psutil.virtual_memory().available // JOB_MEMORY_BYTES)
    return max(1, int(jobs))


def run_settings(settings: RunSettings | None = None, **fields) -> RunSettings:
    """settings with fields (RunSettings fields: timeout_s=..., log_dir=...) set on top; None: those
    of this process's PARITY_* variables, but not strict (a runner made in code is strict only when
    told; `parity run` and the pytest face build theirs with PARITY_STRICT)."""
    base = settings if settings is not None else RunSettings.from_env(strict=False)
    return base.replace(**fields) if fields else base


# The harness as issue 16 found it, for the benchmark's old side (parity run --baseline, with -j 1
# and no reference cache): each switch is one thing the new harness does differently.
BASELINE_SETTINGS = {"overlap_reference": False, "start_method": "spawn", "release_stuck_peers": False,
                     "pipeline": False}


class Runner:
    def __init__(self, settings: RunSettings | None = None, *, overlap_reference: bool = True,
                 max_live_ranks: int = DEFAULT_MAX_LIVE_RANKS, start_method: str = "forkserver",
                 release_stuck_peers: bool = True, pipeline: bool = True, **fields):
        """settings: the run's (run_settings: None and fields as there); the rest: how the harness runs."""
        self.settings = run_settings(settings, **fields)
        self.timeout_s = self.settings.timeout_s
        self.max_live_ranks = max_live_ranks
        self.strict = self.settings.strict
        self.log_dir = self.settings.log_dir
        # The reference pairs this runner's cases share (size and disk copy from the settings).
        self.references = ReferenceCache.from_settings(self.settings)
        # False: the reference is computed after the ranks are done, as the harness did before
        # (parity run --no-reference-cache, the benchmark's baseline).
        self.overlap_reference = overlap_reference
        # How rank groups start and whether stuck peers are released (parity.harness.rank_pool).
        self.start_method = start_method
        self.release_stuck_peers = release_stuck_peers
        # True: a case is judged in a thread while the ranks run the next one (run_all). On the 2-core
        # EPYC the ranks of a 2-rank group keep 1.3 cores busy between them (they wait on each other
        # in collectives), and the comparison was 17% of the default matrix's time, in their gaps.
        self.pipeline = pipeline
        self.pools: dict = {}
        # One thread computes the next case's reference while the ranks run it (Runner._run_ranks).
        self.reference_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-reference")
        self.judge_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-judge")
        self.rank_thread = None  # made by run_all when pipelining
        # Counts close() calls: a case the rank thread took up before a close (Ctrl-C, -x) and reaches its group
        # after it must not start a new group and run there for its whole timeout (the process's exit waits
        # for that thread): it sees the count moved and stops (_run_ranks).
        self.generation = 0

    def pool(self, world_size: int, device: str) -> RankPool:
        """The rank group for this world size and device; self.pools is kept least recently used first."""
        key = (world_size, device)
        pool = self.pools.pop(key, None)
        if pool is None:
            self._make_room(world_size)
            pool = RankPool(world_size, device, self.log_dir, start_method=self.start_method,
                            release_stuck_peers=self.release_stuck_peers, settings=self.settings)
        self.pools[key] = pool
        return pool

    def _make_room(self, world_size: int) -> None:
        """Close least recently used groups until a new one of world_size fits max_live_ranks
        (a group larger than the limit still runs, alone)."""
        while self.pools and sum(p.world_size for p in self.pools.values()) + world_size > self.max_live_ranks:
            self.pools.pop(next(iter(self.pools))).close()

    def close(self, force: bool = False) -> None:
        """force: kill the ranks at once (after Ctrl-C they may be inside a case and never read a stop)."""
        self.generation += 1
        pools, self.pools = list(self.pools.values()), {}  # the rank thread may be making one
        for p in pools:
            p.close(force=force)
        self.reference_thread.shutdown(wait=not force, cancel_futures=True)
        self.reference_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-reference")
        self.judge_thread.shutdown(wait=not force, cancel_futures=True)
        self.judge_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-judge")
        if self.rank_thread is not None:  # a case under way there ends: its group was just closed
            self.rank_thread.shutdown(wait=False, cancel_futures=True)
            self.rank_thread = None

    def rank_pids(self) -> dict:
        """(world size, device) -> the pids of this runner's live rank groups."""
        found: dict = {}
        # A snapshot: with pipeline the rank thread may be making the next case's group meanwhile (a
        # job asks this with every verdict; iterating the live dict raised "dictionary keys changed
        # during iteration" there once, and the job died with the cases it held).
        for key, pool in list(self.pools.items()):
            found.setdefault(key, []).extend(p.pid for p in pool.procs if p.is_alive())
        return found

    def reference_cache_stats(self) -> dict:
        """Reference cache hits and misses (and the disk copy's)."""
        return self.references.stats()

    def occupancy(self) -> dict:
        """Jobs' occupancy (JobProcesses.occupancy): one runner, one case at a time, has none to show."""
        return {}

    def run(self, case: Case) -> Verdict:
        return self._verdict(case, self._start(case, inline=True))

    def run_all(self, cases, maxfail: int | None = None):
        """Yield every case's verdict, in the cases' order, one at a time. With pipeline, the ranks
        run a case (in the rank thread) while the case before it is judged (in the judge thread),
        and a verdict is yielded as soon as it is judged: progress and Ctrl-C see it while the
        next case runs. maxfail: stop after that many failed (the case under way is abandoned: the
        caller closes with force). Several at once are job processes, each a Runner
        (parity.harness.job_processes.job_runner)."""
        failed = 0
        if not self.pipeline:
            for case in cases:
                verdict = self.run(case)
                failed += verdict.status == FAILED
                yield verdict
                if maxfail and failed >= maxfail:
                    return
            return
        if self.rank_thread is None:
            self.rank_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-ranks")
        judging = None
        for case in cases:
            ranked = self.rank_thread.submit(self._start, case, False, self.generation)
            if judging is not None:
                verdict = self._verdict(*judging)
                failed += verdict.status == FAILED
                yield verdict
                if maxfail and failed >= maxfail:
                    return
            judging = (case, ranked.result())
        if judging is not None:
            yield self._verdict(*judging)

    def _verdict(self, case: Case, started) -> Verdict:
        """The verdict of a case _start began: (Future of the verdict, when it began, its timing)."""
        future, began, timing = started
        try:
            verdict = future.result()
        except Exception:  # noqa: BLE001 - a harness bug fails this case, not the whole run
            verdict = Verdict(case, FAILED, reason=f"harness error:\n{traceback.format_exc()}")
            verdict.seconds = time.monotonic() - began
        verdict.env = repro_env(case, self.settings)
        verdict.strict = self.strict
        verdict.timing = close_case(timing, verdict.seconds)
        return verdict

    def _start(self, case: Case, inline: bool, generation: int | None = None):
        """Run the case's ranks here (they are what the cores are for), then judge it in the judge
        thread, or here when inline; returns what _verdict needs. generation: self.generation when the
        case was handed to the rank thread (None: now)."""
        began, timing = time.monotonic(), {}

        def done(verdict: Verdict) -> Verdict:
            verdict.seconds = time.monotonic() - began
            return verdict

        try:
            ranked = self._run_ranks(case, timing, self.generation if generation is None else generation)
        except Exception:  # noqa: BLE001
            ranked = Verdict(case, FAILED, reason=f"harness error:\n{traceback.format_exc()}")
        if isinstance(ranked, Verdict):
            return _inline(done, ranked), began, timing
        outcome, mode, reference = ranked

        def judged() -> Verdict:
            return done(judge(case, outcome, self.strict, mode, reference=reference, timing=timing,
                              references=self.references))

        return (_inline(judged) if inline else self.judge_thread.submit(judged)), began, timing

    def _run_ranks(self, case: Case, timing: dict, generation: int):
        """The case's PoolOutcome, the group's mode and the reference under way; or its Verdict
        when no rank runs it (a skip, a group that failed to start, the runner closed meanwhile)."""
        skipped = skip_verdict(case, self.strict)
        if skipped:
            return skipped

        def closed() -> bool:
            return generation != self.generation

        if closed():
            return Verdict(case, FAILED, reason="harness: not run, the runner was closed before its ranks ran")
        key = (case.world_size, case.values.optional("device", "cpu"))
        pool = self.pool(*key)
        # The reference is computed while the ranks run the case: it depends on the case alone,
        # and a reference that raises raises again where the judge asks for it, as it did inline.
        reference = None
        if self.overlap_reference and not case.expect.is_error:
            reference = self.reference_thread.submit(timed_reference_pair, SUBJECTS[case.subject], case.values,
                                                     self.references)
        try:
            outcome = pool.run(case.subject, case.values, self.timeout_s, cancelled=closed)
        except PoolStartError as exc:
            return Verdict(case, FAILED, reason=str(exc))
        finally:
            if closed():  # a group made or kept for this case after the close: nobody else will close it
                if self.pools.get(key) is pool:
                    del self.pools[key]
                pool.close(force=True)
        timing.update(outcome.timing)
        return outcome, pool.mode, reference


# -- judging: shared by the self-spawning Runner and the torchrun launcher (parity/torchrun_launch.py) --

def timed_verdict(case: Case, produce, settings: RunSettings) -> Verdict:
    """produce() -> Verdict, timed; a harness bug fails this case, not the whole run; settings: the run's."""
    start = time.monotonic()
    try:
        verdict = produce()
    except Exception:  # noqa: BLE001
        verdict = Verdict(case, FAILED, reason=f"harness error:\n{traceback.format_exc()}")
    verdict.seconds = time.monotonic() - start
    verdict.env = repro_env(case, settings)
    return verdict


def skip_verdict(case: Case, strict: bool) -> Verdict | None:
    """Checked before any rank runs the case: a reason makes it a (reported) skip, or a failure under strict."""
    reason = SUBJECTS[case.subject].unavailable_reason(case.values)
    if not reason:
        return None
    if strict:
        return Verdict(case, FAILED, reason=f"strict mode: would skip: {reason}")
    return Verdict(case, SKIPPED, reason=reason)


def timed_reference_pair(subject, values, references: ReferenceCache | None = None):
    """The reference pair (kept in references, where given) and the seconds it took where it ran (a
    thread of its own, overlapping rank work)."""
    with SUBJECT_CODE:
        start = time.monotonic()
        pair = references.pair(subject, values) if references is not None else reference_pair(subject, values)
        return pair, time.monotonic() - start


def judge(case: Case, outcome, strict: bool, mode: str = "", reference=None, timing: dict | None = None,
          references: ReferenceCache | None = None) -> Verdict:
    """Every rank's outcome of one case (a PoolOutcome) -> its verdict. reference: a Future of
    timed_reference_pair already under way (else it is computed here, when needed, kept in
    references where given); timing: where the reference and comparison phases are added
    (parity.harness.timing)."""
    with one_torch_thread():  # stage oracles and comparisons too (parity/checks/one_thread.py)
        verdict = _judge(case, SUBJECTS[case.subject], case.values, outcome, strict, reference, timing, references)
    verdict.mode = mode
    verdict.observed = observed_facts(outcome)
    return verdict


def _judge(case, subject, values, outcome, strict, reference_future=None, timing=None, references=None) -> Verdict:
    if case.expect.is_error:
        return _rejection_verdict(case, outcome, strict)
    if case.divergence is not None and case.divergence.raises and outcome.errors:
        return _crash_divergence_verdict(case, outcome)
    if outcome.errors and not case.divergence:
        for source, known in case.admitted:
            if known.raises:
                again = _crash_divergence_verdict(replace(case, divergence=known), outcome)
                if again.status == DIVERGED:
                    again.reason += f" [mark of {source}]"
                    return again
    if outcome.errors:
        # The rank that raised first is the cause; a peer it left in a collective (RankLost) only says so
        first = min(outcome.errors, key=lambda r: (outcome.errors[r].type == "RankLost", r))
        err = outcome.errors[first]
        return Verdict(case, FAILED, reason=f"rank {first} raised {err.type}: {err.message.splitlines()[0] if err.message else ''}",
                       rank_errors=outcome.errors)
    with phase(timing, "reference"):
        (reference, oracle), computed = (reference_future
                                         or _inline(timed_reference_pair, subject, values, references)).result()
    if timing is not None:
        timing["reference_compute"] = computed
    with phase(timing, "comparison"), SUBJECT_CODE:
        checks = compare(subject, values, outcome.observations, reference, oracle, dict(case.collectives))
    if not any(c.measured is not None for c in checks):
        return Verdict(case, FAILED, checks=checks, reason="no numerical check ran")
    if case.divergence is not None and case.divergence.raises:  # it ran: the crash is gone
        if not all(c.passed for c in checks):
            return Verdict(case, FAILED, checks=checks, reason="the known crash no longer happens, but: "
                                                                + next(c for c in checks if not c.passed).describe())
        return Verdict(case, FAILED if strict else XPASSED, checks=checks, findings={case.divergence.name: FIXED},
                       reason=f"known divergence no longer reproduces ({case.divergence.repro}): remove the mark")
    if case.divergence is not None:
        return _divergence_verdict(case, checks, strict)
    status = PASSED if all(c.passed for c in checks) else FAILED
    if status == FAILED and case.admitted:
        return _admitted_verdict(case, checks, strict) or Verdict(case, status, checks=checks)
    return Verdict(case, status, checks=checks)


def _admitted_verdict(case: Case, checks, strict: bool) -> Verdict | None:
    """A failing unmarked case judged under the marks that admit it (Case.admitted), as parity explore judges one:
    each mark alone, then the numerical ones united (a case under two mechanisms fails the checks of both); the
    first that leaves every failed check explained makes it diverged, else None (it stays failed)."""
    from parity.matrix.cases import merged_divergence

    tries = [(source, known) for source, known in case.admitted if not known.raises]
    if len(tries) > 1:
        tries.append((", ".join(s for s, _ in tries), merged_divergence([k for _, k in tries])))
    for source, known in tries:
        again = _divergence_verdict(replace(case, divergence=known), checks, strict)
        if again.status == DIVERGED:
            again.reason += f" [mark of {source}]"
            return again
    return None


def findings_status(known, failed) -> dict:
    """Each finding a case is marked with: "present" where some failed check is one it explains, else "fixed"."""
    return {f.name: PRESENT if any(f.covers(c.name) for c in failed) else FIXED for f in known.findings}


def _divergence_verdict(case: Case, checks, strict: bool) -> Verdict:
    known = case.divergence
    failed = [c for c in checks if not c.passed]
    findings = findings_status(known, failed)
    if not failed:
        reason = f"known divergence no longer reproduces ({known.repro}): remove the mark"
        return Verdict(case, FAILED if strict else XPASSED, checks=checks, reason=reason, findings=findings)
    unexplained = [c for c in failed if not known.covers(c.name)]
    if unexplained:
        return Verdict(case, FAILED, checks=checks, findings=findings,
                       reason=f"fails beyond its known divergence: {unexplained[0].describe()}")
    present = [f for f in known.findings if findings[f.name] == PRESENT]
    fixed = [name for name, status in findings.items() if status == FIXED]
    return Verdict(case, DIVERGED, checks=checks, findings=findings,
                   reason=f"known divergence: {' | '.join(f.reason for f in present)} "
                          f"(repro: {'; '.join(f.repro for f in present)}); "
                          + (f"fixed here (its checks pass): {', '.join(fixed)}; " if fixed else "")
                          + f"{len(failed)} checks differ, first: {failed[0].describe()}")


def _crash_divergence_verdict(case: Case, outcome) -> Verdict:
    """A documented crash: some rank raises the named error; every other error must be a peer lost to it
    (a rank waiting in the collective the crashed one never joins)."""
    known = case.divergence
    named = {r: e for r, e in outcome.errors.items() if known.raises in f"{e.type}: {e.message}"}
    other = {r: e for r, e in outcome.errors.items() if r not in named and e.type != "RankLost"}
    if named and not other:
        first = min(named)
        return Verdict(case, DIVERGED, rank_errors=outcome.errors, findings={known.name: PRESENT},
                       reason=f"known divergence: {known.reason} (repro: {known.repro}); rank {first} raised "
                              f"{named[first].type}: {named[first].message.splitlines()[0]}")
    first = min(other or outcome.errors)
    err = outcome.errors[first]
    return Verdict(case, FAILED, rank_errors=outcome.errors,
                   reason=f"expected the known crash ({known.raises!r}); rank {first} raised {err.type}: "
                          f"{err.message.splitlines()[0] if err.message else ''}")


def _inline(fn, *args) -> Future:
    """fn(*args) run here and now, as a finished Future (its exception, if any, raised by result())."""
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except Exception as exc:  # noqa: BLE001 - re-raised by result(), where the caller expects it
        future.set_exception(exc)
    return future


def _rejection_verdict(case: Case, outcome, strict: bool) -> Verdict:
    want = case.expect
    state_checked = SUBJECTS[case.subject].records_state_after_rejection(case.values)
    problems, checks = [], []
    for rank in range(case.world_size):
        err = outcome.errors.get(rank)
        if err is None:
            problem = f"rank {rank} raised nothing (expected {want.error} matching {want.match!r})"
        elif err.type != want.error or want.match not in err.message:
            problem = (f"rank {rank} raised {err.type}: {err.message.splitlines()[0] if err.message else ''!s}"
                       f" (expected {want.error} matching {want.match!r})")
        else:
            problem = None
        checks.append(Check("rejection", problem is None, rank=rank,
                            detail=problem or f"raised {want.error} matching {want.match!r}"))
        if problem:
            problems.append(problem)
        elif state_checked:  # the right error: now what it left behind
            for state in state_after_rejection_checks(rank, err.facts):
                checks.append(state)
                if not state.passed:
                    problems.append(f"rank {rank} raised {want.error} but {state.name}: {state.detail}")
    known = case.divergence
    failed = [c for c in checks if not c.passed]
    findings = findings_status(known, failed) if known else {}
    if problems and known:
        unexplained = [c for c in failed if not known.covers(c.name)]
        if unexplained:
            return Verdict(case, FAILED, checks=checks, rank_errors=outcome.errors, findings=findings,
                           reason=f"fails beyond its known divergence: {unexplained[0].describe()}")
        return Verdict(case, DIVERGED, checks=checks, rank_errors=outcome.errors, findings=findings,
                       reason=f"known divergence: {known.reason} (repro: {known.repro}); {problems[0]}")
    if problems:
        return Verdict(case, FAILED, checks=checks, reason="; ".join(problems), rank_errors=outcome.errors)
    if known:
        reason = f"known divergence no longer reproduces ({known.repro}): every rank raised {want.error}"
        return Verdict(case, FAILED if strict else XPASSED, checks=checks, reason=reason, findings=findings)
    clean = " and left the model untouched" if state_checked else ""
    return Verdict(case, PASSED, checks=checks, reason=f"every rank raised {want.error} matching {want.match!r}{clean}")


def observed_facts(outcome) -> dict:
    """What ran, per rank, in a form the summary can show: CE backend calls counted by backend."""
    facts = {}
    for rank, obs in sorted(outcome.observations.items()):
        calls = obs.facts.get("loss_backend")
        if calls:
            counts: dict = {}
            for backends in calls.values():
                for b in backends:
                    counts[b] = counts.get(b, 0) + 1
            facts.setdefault("loss_backend_calls", {})[f"rank{rank}"] = counts
        comm = obs.facts.get("collectives")
        if comm:  # per micro-batch counts, each distinct set once (usually one for every micro-batch)
            distinct = []
            for counts in comm.values():
                if counts not in distinct:
                    distinct.append(counts)
            facts.setdefault("collectives_per_micro", {})[f"rank{rank}"] = distinct
    return facts
