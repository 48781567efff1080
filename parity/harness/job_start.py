"""Where a -j job process begins: it starts its ranks' forkserver before anything heavy is imported.

A job's forkserver preloads torch, the Inductor modules use_deterministic_algorithms pulls in, and the
frameworks (parity/harness/rank_pool.py: 16 s on the H200 host's Xeon, where `import torch` alone takes
5 s); the job itself imports torch, numpy and the checks (5-6 s there). Begun from job_main, the
two ran one after the other, and every job's first batch waited for both (about 23 s, measured with
`parity run --profile`, results/perf/h200-16-cores-r7/). Begun here, the forkserver imports side by
side with the job. So this module imports nothing heavy itself: rank_pool's start_context needs
only the standard library.
"""
from __future__ import annotations


def job_entry(job_id: int, settings: dict, tasks, results) -> None:
    """A job process's target: the forkserver first (warm_up finds it running), then job_main."""
    device = settings.get("warm_device")
    if device is not None:
        from parity.harness.rank_pool import start_context

        start_context(settings["runner"].get("start_method", "forkserver"), device)
    from parity.harness.job_processes import job_main

    job_main(job_id, settings, tasks, results)
