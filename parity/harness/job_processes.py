"""parity run -j N: N job processes side by side, each a Runner with its own rank groups.

Why processes, not threads in the parent: the parent's share of a case (the reference, unpickling
what the ranks sent, the comparison's checks: about 700k for the default matrix) is Python under
one GIL. With jobs as threads, that share ran one case at a time: on the H200 host's 16 cores the
default matrix took over 300 s at -j 2, no faster than one case at a time. A job process does its
cases' references and comparisons itself, so the parent only dispatches and yields verdicts.

How cases are dealt out:
- in batches of cases that share a world size, a device and a reference_key (parity.checks.compare),
  so one job computes each reference once, as a single process did, and reuses one warm group;
- a batch goes to an idle job that already holds a live group of its world size if there is one
  (starting a group costs seconds of imports per rank);
- a batch is sent only while the ranks of the batches under way leave room for its world size on
  the cores, so ranks never outnumber the cores (a batch larger than all the cores runs alone).

Verdicts come back in the cases' order and do not depend on which job ran a case (a rank seeds
everything from the case, a reference is a function of the case): tests/harness/test_jobs.py holds
results.jsonl bitwise to the serial harness's. A job that dies fails the cases it still held, with
its exit code, and is replaced; nothing waits on it.
"""
from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import pickle
import queue
import time
from collections import deque

from parity.checks.verdict import FAILED, Verdict
from parity.harness.job_body import job_entry
from parity.harness.runner import Runner, available_cores, run_settings
from parity.settings import RunSettings

RUN_FIELDS = {f.name for f in dataclasses.fields(RunSettings)}

# How far down the queue a free slot looks for a batch that fits (far enough to pass a few large
# batches, near enough that verdicts still come back roughly in order).
LOOKAHEAD = 64
# Seconds a job gets to leave after being told to (it closes its rank groups first).
JOB_CLOSE_S = 20.0
# Seconds a job told to stop at once (SIGTERM: Ctrl-C, -x) gets to kill its ranks and leave before it is killed;
# its ranks die with it (rank_worker.die_with_parent).
JOB_KILL_S = 3.0


def job_runner(jobs: int, settings: RunSettings | None = None, **runner_settings):
    """What runs the cases: one Runner in this process for jobs <= 1, else JobProcesses of that
    many. Both answer run_all, rank_pids, reference_cache_stats, occupancy and close. settings: the
    run's (parity.harness.runner.run_settings); runner_settings: Runner's keywords.

    A pipelining Runner here computes references and judges cases while its ranks run the next case,
    on the same cores: its torch gets one thread, as a job process's does (job_main). With torch's
    default (one per core) its OpenMP threads wait on each other while the ranks hold the cores: on
    a 90-case selection on 2 cores, 9% more CPU in the parent (0.6 s more of it in the kernel); the
    references of 40 cases of it, with another workload on the cores, 8.6 CPU seconds against 0.7.
    The numbers are the same (the kernels run these sizes on one thread; -j N was held bitwise to
    this). The baseline (pipeline off) keeps the harness as it was."""
    if jobs <= 1:
        if runner_settings.get("pipeline", True):
            import torch

            torch.set_num_threads(1)
        return Runner(settings, **runner_settings)
    return JobProcesses(jobs, runner_settings, settings=settings)


def batches(cases) -> list[list[tuple[int, object]]]:
    """(index, case) lists, each of one world size, device and reference_key, in the order of their
    first case; cases without a reference_key (rejections, subjects that share none) come one by one."""
    from parity.subjects import SUBJECTS

    grouped: dict = {}
    for index, case in enumerate(cases):
        key = None if case.expect.is_error else SUBJECTS[case.subject].reference_key(case.values)
        slot = (case.world_size, case.values.optional("device", "cpu"), repr(key)) if key is not None else ("one", index)
        grouped.setdefault(slot, []).append((index, case))
    return list(grouped.values())


def job_cache_size(process_size: int, jobs: int) -> int:
    """Each job's share of the reference LRU's bound: together the jobs hold no more reference pairs
    than one process would (RunSettings.reference_cache_size; 0, --no-reference-cache, stays 0).

    Why a share and not the whole bound per job: a batch holds every case of one reference_key at
    one world size, so a job reuses a pair within its batch and rarely after it. With the whole
    bound each job kept up to 256 pairs it would not ask for again, and the default matrix's 451
    keys reached it only over several passes: on the H200 host's 16 cores at -j 8 the jobs' RSS grew
    31% over five passes (results/perf/h200-16-cores-soak/), where the soak target is flat within 10%."""
    return -(-process_size // max(1, jobs))


# Batches of at least this many ranks go out first (dispatch_order).
EARLY_WORLD = 4


def dispatch_order(grouped: list) -> list:
    """The batches with EARLY_WORLD ranks or more first, each part in case order. Measured on the H200
    host's 16 cores (results/perf/h200-16-cores-r7/): in case order the run ended with 15 s of cores
    mostly idle while the last, 4-rank batches (torch tp 4, about 4 s a case) finished; such a batch
    also needs four free cores at once, which a busy pool rarely has. Sent first, they overlap the many
    small batches. Verdicts still come back in case order: a batch sent early only waits to be yielded."""
    return ([b for b in grouped if b[0][1].world_size >= EARLY_WORLD]
            + [b for b in grouped if b[0][1].world_size < EARLY_WORLD])


def needed_capabilities(cases) -> set[str]:
    from parity.subjects import SUBJECTS

    return {name for c in cases for name in SUBJECTS[c.subject].requires(c.values)}


def warm_settings(cases) -> dict:
    """The device the jobs' first rank groups will start for (the forkserver is made once, for the
    first; None where the selection holds cuda cases this machine can run, so the first group
    decides as before) and the modules the selected subjects' references import."""
    from parity.observe import capabilities
    from parity.subjects import SUBJECTS

    cuda = any(c.values.optional("device", "cpu") == "cuda" for c in cases) and capabilities.missing("cuda") is None
    imports = sorted({m for c in cases for m in SUBJECTS[c.subject].reference_imports})
    return {"warm_device": None if cuda else "cpu", "warm_imports": imports}


class _Job:
    def __init__(self, job_id: int, ctx, settings: dict, results):
        self.id = job_id
        self.tasks = ctx.Queue()
        self.proc = ctx.Process(target=job_entry, args=(job_id, settings, self.tasks, results),
                                name=f"parity-job-{job_id}", daemon=False)
        self.proc.start()
        self.batch: dict = {}  # index -> case, what it was sent and has not answered yet
        self.ranks = 0  # the largest world size of the batch under way
        self.sent = (0.0, 0, "")  # when the batch under way was sent, its cases, and their subject
        self.answers = dict(settings["capabilities"])  # the capabilities it has (JobProcesses._send)
        self.live: dict = {}  # (world size, device) -> pids, as it last said
        self.stats: dict = {}

    @property
    def idle(self) -> bool:
        return not self.batch


class JobProcesses:
    """N job processes, kept across run_all calls (parity run --passes reuses them and their ranks)."""

    def __init__(self, jobs: int, runner_settings: dict, cores: int | None = None,
                 settings: RunSettings | None = None):
        """runner_settings: Runner's keywords (RunSettings fields among them go on top of settings)."""
        self.jobs = jobs
        self.cores = cores or available_cores()
        fields = {k: v for k, v in runner_settings.items() if k in RUN_FIELDS}
        run = run_settings(settings, **fields)
        # What every job process starts with (job_body.job_main): the run's settings, its share of
        # the reference cache's bound among them.
        self.settings = {"run": run.replace(reference_cache_size=job_cache_size(run.reference_cache_size, jobs)).as_dict(),
                         "runner": {k: v for k, v in runner_settings.items() if k not in RUN_FIELDS},
                         "capabilities": {}}
        self.ctx = mp.get_context("spawn")
        self.results = self.ctx.Queue()
        self.pool: list[_Job] = []
        self.started = 0
        self.head_passed = 0  # batches sent ahead of the first in line since it became first
        # When each batch was sent and answered, for --profile's occupancy (parity.harness.timing).
        self.clock = {"created": time.monotonic()}
        self.spans: list[tuple] = []  # (job id, world size, cases, sent, done, subject); monotonic seconds
        self.probing: dict = {}  # capability -> the future of its probe, until answered (_known)
        self.needs: dict = {}  # a batch's first index -> the capabilities its cases need (_needs)

    def _start(self, cases) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from parity.observe import capabilities

        # Probed once here, not once per job, each probe a child process of seconds (Triton's
        # interpreter, megatron's import): side by side, in threads, while the jobs start and run the
        # batches that need none of them; a batch that needs one waits for its answer, which reaches a
        # job's queue before that batch (_send). One after the other, before any job started, they
        # took 11.3 s on the H200 host's 16 cores (results/perf/h200-16-cores-r6); with every batch
        # waiting for all of them, 24.8 s among the jobs' own start-up.
        wanted = sorted(needed_capabilities(cases) - set(self.settings["capabilities"]) - set(self.probing))
        if wanted:
            prober = ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="parity-probe")
            self.probing.update({name: prober.submit(capabilities.missing, name) for name in wanted})
            prober.shutdown(wait=False)
        if not self.pool:
            self.settings.update(warm_settings(cases))
        while len(self.pool) < self.jobs:
            self.pool.append(_Job(self.started, self.ctx, self.settings, self.results))
            self.started += 1

    def _known(self) -> dict:
        """The capabilities answered so far (a finished probe moves from probing to the settings)."""
        for name, future in list(self.probing.items()):
            if future.done():
                self.settings["capabilities"][name] = future.result()
                del self.probing[name]
                self.clock["probed"] = time.monotonic()
        return self.settings["capabilities"]

    def _needs(self, batch) -> set:
        """The capabilities a batch's cases need, decided once per batch (keyed by its first index)."""
        key = batch[0][0]
        if key not in self.needs:
            self.needs[key] = needed_capabilities(case for _, case in batch)
        return self.needs[key]

    def _send(self, job, batch) -> None:
        """The batch, after the answers this job has not had yet (it presets them before the batch)."""
        news = {k: v for k, v in self._known().items() if k not in job.answers}
        if news:
            job.tasks.put(news)
            job.answers.update(news)
        job.tasks.put(batch)

    def run_all(self, cases, maxfail: int | None = None):
        """Yield every case's verdict, in the cases' order. maxfail (-x, --maxfail): once that many cases
        have failed, counted as their verdicts arrive and not in case order (a failure behind a slow case
        must not wait for it), yield the verdicts already here, in order, and stop; the batches still out
        are abandoned (the caller closes the jobs with force). The cases then go out in case order, so
        the failures a run in order meets first come first."""
        if any(not job.idle for job in self.pool):
            raise RuntimeError("run_all: the previous run_all was not finished")
        if not cases:
            return
        self._start(cases)
        pending = deque(batches(cases) if maxfail else dispatch_order(batches(cases)))
        done: dict = {}
        following = failed = 0
        while following < len(cases):
            self._dispatch(pending, done)
            self._collect(done)
            while following in done:
                verdict = done.pop(following)
                verdict.case = cases[following]  # the caller's own object, not a copy
                failed += verdict.status == FAILED
                yield verdict
                following += 1
            if maxfail and failed + sum(v.status == FAILED for v in done.values()) >= maxfail:
                for index in sorted(done):
                    verdict = done.pop(index)
                    verdict.case = cases[index]
                    yield verdict
                return

    def _dispatch(self, pending: deque, done: dict) -> None:
        """Send batches to idle jobs while the cores have room. The first batch that fits goes,
        not only the first in line: a batch of 8 ranks at the head must not keep every 2-rank batch
        behind it waiting while 14 cores idle (measured on 16 cores: 3.9 of 8 jobs busy on average).
        A batch that does not fit waits until enough ranks are free, or until nothing runs."""
        self._replace_dead(done)
        while pending:
            idle = [job for job in self.pool if job.idle]
            if not idle:
                return
            busy = sum(job.ranks for job in self.pool)
            # Once the head was passed LOOKAHEAD times the others wait for it, so a large batch is
            # not starved (and the verdicts behind it are not held back) until the very end.
            window = 1 if self.head_passed >= LOOKAHEAD else LOOKAHEAD
            known = self._known()
            fits = next((i for i, batch in enumerate(itertools.islice(pending, window))
                         if (not busy or busy + batch[0][1].world_size <= self.cores)
                         and self._needs(batch) <= known.keys()), None)
            if fits is None:
                return
            self.head_passed = self.head_passed + 1 if fits else 0
            batch = pending[fits]
            del pending[fits]
            world, device = batch[0][1].world_size, batch[0][1].values.optional("device", "cpu")
            warm = [job for job in idle if (world, device) in job.live]
            job = warm[0] if warm else min(idle, key=lambda j: sum(len(p) for p in j.live.values()))
            job.batch = {index: case for index, case in batch}
            job.sent = (time.monotonic(), len(batch), getattr(batch[0][1], "subject", ""))
            job.ranks = world
            job.live.setdefault((world, device), [])  # warm by the time the next such batch comes
            self._send(job, batch)

    def _collect(self, done: dict) -> None:
        try:
            message = self.results.get(timeout=0.5)
        except queue.Empty:
            return  # the next _dispatch replaces a job that died
        job_id, index, payload, stats, live = message
        job = next((j for j in self.pool if j.id == job_id), None)
        if job is None:  # a replaced job's last words
            return
        job.batch.pop(index, None)
        done[index] = pickle.loads(payload)
        job.stats, job.live = stats, live
        if not job.batch:
            self.spans.append((job.id, job.ranks, job.sent[1], job.sent[0], time.monotonic(), job.sent[2]))
            job.ranks = 0

    def _replace_dead(self, done: dict) -> None:
        for slot, job in enumerate(self.pool):
            if job.proc.is_alive():
                continue
            why = f"job process {job.proc.name} (pid {job.proc.pid}) died with exit code {job.proc.exitcode}"
            for index, case in job.batch.items():
                done[index] = Verdict(case, FAILED, reason=f"harness error: {why} while it held this case")
            job.tasks.cancel_join_thread()
            self.pool[slot] = _Job(self.started, self.ctx, self.settings, self.results)
            self.started += 1

    def rank_pids(self) -> dict:
        """(world size, device) -> the pids of every job's live ranks, plus ("jobs", "") -> the jobs'."""
        found: dict = {("jobs", ""): [job.proc.pid for job in self.pool if job.proc.is_alive()]}
        for job in self.pool:
            for key, pids in job.live.items():
                if pids:
                    found.setdefault(tuple(key), []).extend(pids)
        return found

    def occupancy(self) -> dict:
        """How busy the jobs and the cores were (parity.harness.timing.occupancy), from every batch's
        send and answer times since this object was made."""
        from parity.harness.timing import occupancy

        return occupancy(self.spans, self.clock, self.jobs, self.cores)

    def reference_cache_stats(self) -> dict:
        total: dict = {}
        for job in self.pool:
            for name, count in job.stats.items():
                total[name] = total.get(name, 0) + count
        return total

    def close(self, force: bool = False) -> None:
        """force: the jobs may be mid-batch (Ctrl-C, -x): SIGTERM, and SIGKILL after JOB_KILL_S."""
        for job in self.pool:
            if force:
                job.proc.terminate()  # SIGTERM: it closes its ranks and leaves
                job.tasks.cancel_join_thread()
            else:
                job.tasks.put(None)
        deadline = time.monotonic() + (JOB_KILL_S if force else JOB_CLOSE_S)
        for job in self.pool:
            job.proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if job.proc.is_alive():
                job.proc.kill()
                job.proc.join(timeout=5)
        self.pool.clear()

