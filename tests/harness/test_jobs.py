"""parity run, one job or N, with references shared and overlapped with rank work, cases judged while
the ranks run the next, forked ranks and stuck peers released, gives what the old harness (--baseline:
one case at a time, every reference computed after its ranks are done, spawned ranks, a stuck peer
waited out) gives: the same verdicts in the same order and a bitwise identical results.jsonl, on a
selection that mixes world sizes 2 and 3, skips, a rejection, a known divergence and a documented
crash that leaves a peer in a collective."""
import json
import time

from parity.harness.job_processes import job_runner
from parity.harness.runner import BASELINE_SETTINGS, Runner, default_jobs, run_settings
from parity.matrix.cases import load
from parity.report.records import result_lines
from parity.settings import RunSettings
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve

CPU_VALUES = resolve(SUBJECTS["column_gathered"], {"device": "cpu"})  # a stand-in case's values


def mixed_selection():
    cases, picked = load(), []
    rules = [
        lambda c: c.subject == "column_gathered" and c["tp"] == 3 and c["dtype"] == "fp32" and c["zero"] == 0,
        lambda c: c.subject == "ds_vocab_ce" and c["dtype"] == "bf16" and c["tp"] == 2,
        lambda c: c.subject == "ds_reject",
        lambda c: c.divergence is not None and c.subject != "liger_vocab_ce",
        lambda c: c.values.optional("device", None) == "cuda",
        # rank 1 asserts in ZeRO 3's first forward, rank 0 waits in a collective (a stuck peer)
        lambda c: c.subject == "row_parallel" and c.divergence is not None and bool(c.divergence.raises)
        and c["zero"] == 3 and c["dtype"] == "fp32",
    ]
    for rule in rules:
        picked += [c for c in cases if rule(c) and c not in picked and c.world_size <= 3][:2]
    return picked


def _results(cases, jobs, baseline=False):
    """The verdicts, results.jsonl's lines, and the references one runner kept (None for jobs > 1).
    Each runner has its own reference cache: each run computes its own references, as a fresh process would."""
    settings = run_settings(timeout_s=120, **({"reference_cache_size": 0} if baseline else {}))
    runner = job_runner(jobs, settings, **(BASELINE_SETTINGS if baseline else {}))
    try:
        verdicts = list(runner.run_all(cases))
    finally:
        runner.close()
    lines = [json.dumps(line, default=str, separators=(",", ":")) for v in verdicts
             for line in result_lines(v.as_dict())]
    kept = len(runner.references.memory) if isinstance(runner, Runner) else None
    return [(v.case.id, v.status, v.reason) for v in verdicts], "\n".join(lines), kept


def test_parallel_jobs_give_the_serial_results_bitwise():
    cases = mixed_selection()
    assert {c.world_size for c in cases} == {2, 3} and any(c.divergence for c in cases)
    serial, serial_lines, kept = _results(cases, 1, baseline=True)
    assert kept == 0  # the baseline kept no reference
    for jobs in (1, 2):
        new, new_lines, _ = _results(cases, jobs)
        assert new == serial, jobs
        assert new_lines == serial_lines, jobs
    assert [s for _, s, _ in serial].count("passed") >= 4 and "skipped" in [s for _, s, _ in serial]


def test_default_jobs_feeds_the_cores_at_the_smallest_world_size_within_memory(monkeypatch):
    import psutil

    from parity.harness import runner

    cases = [c for c in load() if c.world_size == 2][:1] + [c for c in load() if c.world_size == 4][:1]
    memory = type("Memory", (), {"available": 64 * runner.JOB_MEMORY_BYTES})
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert default_jobs(cases) == 8
    assert default_jobs(cases[1:]) == 4
    memory.available = 3 * runner.JOB_MEMORY_BYTES
    assert default_jobs(cases) == 3  # each job's rank groups must fit in memory
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert default_jobs(cases) == 1


def test_batches_keep_a_reference_and_a_world_size_together():
    from parity.harness.job_processes import batches
    from parity.subjects import SUBJECTS

    cases = [c for c in load() if c.subject == "column_gathered" and c["dtype"] == "fp32"][:40]
    found = batches(cases)
    assert sorted(i for b in found for i, _ in b) == list(range(len(cases)))
    for batch in found:
        keys = {(c.world_size, repr(SUBJECTS[c.subject].reference_key(c.values))) for _, c in batch}
        assert len(keys) == 1
    assert any(len(b) > 1 for b in found)  # cases that share a reference go to one job


def test_the_jobs_together_hold_no_more_references_than_one_process():
    from parity.harness.job_processes import JobProcesses, job_cache_size

    assert [job_cache_size(256, j) for j in (1, 2, 3, 8, 300)] == [256, 128, 86, 32, 1]
    assert job_cache_size(0, 8) == 0  # --no-reference-cache reaches the jobs
    jobs = JobProcesses(8, {}, cores=16, settings=RunSettings(reference_cache_size=256))  # no process starts yet
    try:
        assert jobs.settings["run"]["reference_cache_size"] == 32
    finally:
        jobs.close()


def test_a_dead_job_fails_the_cases_it_held_and_the_run_goes_on():
    import os
    import signal
    from collections import deque

    from parity.harness.job_processes import JobProcesses, batches

    # two cases expected to pass (the first column_gathered ones of the files may be marked divergences)
    cases = [c for c in load() if c.subject == "column_gathered" and c["tp"] == 2 and c["dtype"] == "fp32"
             and c.divergence is None][:2]
    jobs = JobProcesses(1, {"timeout_s": 120})
    try:
        jobs._start(cases)
        done: dict = {}
        jobs._dispatch(deque(batches(cases[:1])), done)
        os.kill(jobs.pool[0].proc.pid, signal.SIGKILL)  # while it starts its ranks for the case
        deadline = time.monotonic() + 60
        while 0 not in done and time.monotonic() < deadline:
            jobs._dispatch(deque(), done)  # as run_all does: a dead job is replaced here
            jobs._collect(done)
        assert done[0].status == "failed" and "died with exit code -9" in done[0].reason
        after = list(jobs.run_all(cases))  # a fresh job took its place
        assert [v.status for v in after] == ["passed", "passed"]
    finally:
        jobs.close()


def test_dispatch_passes_a_batch_that_does_not_fit_but_not_for_ever():
    from collections import deque
    from types import SimpleNamespace

    from parity.harness import job_processes
    from parity.harness.job_processes import JobProcesses

    def batch(world):
        return [(0, SimpleNamespace(world_size=world, values=CPU_VALUES))]

    class Job(SimpleNamespace):
        idle = property(lambda self: not self.batch)

    def stub_jobs(n, busy_ranks):
        jobs = JobProcesses.__new__(JobProcesses)
        jobs.cores, jobs.head_passed, jobs._replace_dead = 4, 0, lambda done: None
        jobs.settings, jobs.probing, jobs.clock = {"capabilities": {}}, {}, {}
        jobs._needs = lambda batch: set()
        jobs.pool = [Job(batch={}, ranks=0, live={}, answers={}, tasks=SimpleNamespace(put=lambda b: None))
                     for _ in range(n)]
        jobs.pool[0].batch, jobs.pool[0].ranks = {9: None}, busy_ranks
        return jobs

    jobs, pending = stub_jobs(3, 2), deque([batch(4), batch(2), batch(2)])
    jobs._dispatch(pending, {})
    assert [b[0][1].world_size for b in pending] == [4, 2]  # one 2-rank batch went past the 4
    jobs = stub_jobs(3, 2)
    jobs.head_passed = job_processes.LOOKAHEAD
    pending = deque([batch(4), batch(2)])
    jobs._dispatch(pending, {})
    assert len(pending) == 2  # passed often enough: the rest wait for it


def test_a_batch_waits_for_the_probe_it_needs_and_the_others_do_not():
    """Capabilities are probed in threads while the jobs run what needs none of them; a job hears
    an answer on its queue before the first batch that needs it (JobProcesses._send)."""
    from collections import deque
    from concurrent.futures import Future
    from types import SimpleNamespace

    from parity.harness.job_processes import JobProcesses

    class Job(SimpleNamespace):
        idle = property(lambda self: not self.batch)

    sent = []
    jobs = JobProcesses.__new__(JobProcesses)
    jobs.cores, jobs.head_passed, jobs._replace_dead = 8, 0, lambda done: None
    probe = Future()
    jobs.settings, jobs.probing, jobs.clock = {"capabilities": {"cuda": "no"}}, {"triton_interpreter": probe}, {}
    needs = {0: {"triton_interpreter"}, 1: set(), 2: {"cuda"}}
    jobs._needs = lambda batch: needs[batch[0][0]]
    jobs.pool = [Job(id=i, batch={}, ranks=0, live={}, answers={}, sent=(0.0, 0),
                     tasks=SimpleNamespace(put=lambda item, i=i: sent.append((i, item)))) for i in range(3)]

    def batch(index):
        return [(index, SimpleNamespace(world_size=2, values=CPU_VALUES))]
    pending = deque([batch(0), batch(1), batch(2)])
    jobs._dispatch(pending, {})
    assert [b[0][0] for b in pending] == [0]  # the two that need no unanswered probe went
    assert sent[0] == (0, {"cuda": "no"}) and sent[1][1][0][0] == 1  # answers first, then the batch
    probe.set_result(None)
    jobs._dispatch(pending, {})
    assert not pending
    assert sent[-2] == (2, {"cuda": "no", "triton_interpreter": None}) and sent[-1][1][0][0] == 0
    assert jobs.settings["capabilities"]["triton_interpreter"] is None and not jobs.probing


def test_maxfail_stops_on_a_failure_behind_a_slow_case():
    """Job processes count failures as their verdicts arrive: a failure that finishes while an earlier case
    still runs (here one that hangs for the whole timeout) stops the run then, not when the hung case ends."""
    from pathlib import Path

    from parity.checks.verdict import FAILED
    from parity.harness.job_processes import JobProcesses

    # tests/conftest.py registered the faulty subjects, here and in every process started later
    by_id = {c.id: c for c in load([Path(__file__).resolve().parents[1] / "cases" / "faulty.toml"])}
    hangs = by_id["faulty_hangs_on_rank0-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"]
    fails = by_id["faulty_always_rejects-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"]
    jobs = JobProcesses(2, {}, cores=4, settings=run_settings(timeout_s=900))
    start = time.monotonic()
    try:
        verdicts = list(jobs.run_all([hangs, fails], maxfail=1))
    finally:
        jobs.close(force=True)
    assert [(v.case.id, v.status) for v in verdicts] == [(fails.id, FAILED)]
    # a few seconds on a quiet machine; the bound is the hung case's timeout, so a loaded one passes too
    assert time.monotonic() - start < 600, "waited for the hung case"
