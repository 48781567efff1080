"""The body of a -j job process (parity.harness.job_processes starts them): it runs the batches it is sent
and answers one verdict per case.

It begins by starting its ranks' forkserver, before anything heavy is imported. That forkserver preloads
torch, the Inductor modules use_deterministic_algorithms pulls in, and the frameworks
(parity/harness/rank_pool.py: 16 s on the H200 host's Xeon, where `import torch` alone takes 5 s); the
job itself imports torch, numpy and the checks (5-6 s there). Begun after those, the two ran one after
the other, and every job's first batch waited for both (about 23 s, measured with `parity run
--profile`, results/perf/h200-16-cores-r7/). Begun first, the forkserver imports side by side with the
job. So this module imports only the standard library at the top; the rest is imported where used.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback


def job_entry(job_id: int, settings: dict, tasks, results) -> None:
    """A job process's target: its ranks' forkserver for the device of their first group (``warm_device``;
    None leaves it to that group), then job_main."""
    device = settings.get("warm_device")
    if device is not None:
        from parity.harness.rank_pool import start_context

        start_context(settings["runner"].get("start_method", "forkserver"), device)
    job_main(job_id, settings, tasks, results)


def job_main(job_id: int, settings: dict, tasks, results) -> None:
    """The body of one job process: run the batches it is sent, one verdict per case, until None."""
    # SIGTERM (the parent closing in a hurry) must still close this job's rank groups: they are
    # its children and would otherwise wait on their task queues for ever.
    from parity.harness.rank_worker import die_with_parent  # the standard library only

    stopped = []

    def stop(*_):
        stopped.append(True)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # The parent killed (SIGKILL, an OOM killer, a CI timeout) cannot tell this job to stop: the kernel
    # does, with the same SIGTERM, so its ranks are closed rather than left waiting for ever.
    die_with_parent(signal.SIGTERM)
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the kernel was asked
        sys.exit(143)
    import torch

    from parity.checks.verdict import FAILED, Verdict
    from parity.harness.runner import Runner
    from parity.mutation.catalog import apply_named
    from parity.observe import capabilities
    from parity.settings import RunSettings

    # The jobs share the cores: a reference's kernels get one thread each (at these sizes torch
    # runs them on one thread anyway, so the numbers are the parent's).
    torch.set_num_threads(1)
    capabilities.preset(settings["capabilities"])
    warm_up(settings.get("warm_imports", ()))
    run = RunSettings(**settings["run"])  # the parent's, with this job's share of the reference cache
    apply_named(run.mutant, "parent")  # a planted reference mutant lives where references are computed
    runner = Runner(run, **settings["runner"])
    try:
        while True:
            batch = tasks.get()
            if batch is None:
                break
            if isinstance(batch, dict):  # capabilities probed since it started (JobProcesses._send)
                capabilities.preset(batch)
                continue
            # run_all: a batch's cases are judged while the ranks run the next one (Runner.pipeline)
            for (index, case), verdict in zip(batch, runner.run_all([case for _, case in batch])):
                try:
                    payload = pickle.dumps(verdict)
                except Exception:  # noqa: BLE001 - an unpicklable verdict must not vanish in the queue's feeder thread
                    payload = pickle.dumps(Verdict(case, FAILED, seconds=verdict.seconds,
                                                   reason=f"harness error: the verdict could not be sent "
                                                          f"back:\n{traceback.format_exc()}"))
                # With every verdict, what the job holds now: its cache's counts, its live ranks.
                results.put((job_id, index, payload, runner.reference_cache_stats(), runner.rank_pids()))
    finally:
        runner.close(force=bool(stopped))  # told to stop: its ranks may be mid-case, kill them


def warm_up(imports) -> None:
    """What a job does before its first batch, while the parent still probes the capabilities and its
    forkserver preloads (job_entry started it): import what its references will need (``imports``:
    transformers' Llama for the HF subjects, seconds that otherwise fell on the first HF case each job
    met, at the end of the matrix: the run's tail). Measured with parity run --profile's occupancy."""
    import importlib

    for name in imports:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the case that needs it reports its own import error
            pass
