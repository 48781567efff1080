"""The slow parts of writing a report, side by side in forked worker processes: results.jsonl and
report.html's figures, while this process writes summary.json and summary.md. One after the other
they were most of the report's time, and each is the work of one core.

Forked, not spawned: a worker starts with the verdict dicts already in its memory (nothing pickled
on the way there, no second import of the suite) and sends back only what it made (base64 PNG text,
a count of lines). With 0 workers, or where fork is not to be had, each part runs in this process
when its result is asked for, to the same bytes (tests/report/test_writer_golden.py writes the
report both ways).
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import sys

MAX_WORKERS = 4  # a report has five or six parts: more processes would mostly start and wait


def default_workers() -> int:
    """One worker per core, at most MAX_WORKERS; 0 off Linux, where forking a process that holds
    other libraries' threads is not safe to count on (macOS), or not there at all (Windows)."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return 0
    return min(MAX_WORKERS, os.cpu_count() or 1)


_records: list = []  # a worker's records: the parent's, as they were when it forked


def _inherit(records: list) -> None:
    global _records
    _records = records


def _run_inherited(task, args: tuple):
    return task(_records, *args)


class _Here:
    """A part run in this process, when its result is asked for."""

    def __init__(self, task, records: list, args: tuple):
        self.task, self.records, self.args = task, records, args

    def result(self):
        return self.task(self.records, *self.args)


class Parts:
    """The parts of one report: each a task(records, *args), run by one of `workers` forked
    processes (0: in this process); submit() returns what result() is asked of."""

    def __init__(self, records: list, workers: int):
        self.records, self.workers, self.pool = records, workers, None

    def submit(self, task, *args):
        if self.workers < 1:
            return _Here(task, self.records, args)
        if self.pool is not None:
            return self.pool.submit(_run_inherited, task, args)
        from concurrent.futures import ProcessPoolExecutor

        # initargs reach a forked worker as memory it shares with this process, not as a pickle.
        self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"),
                                        initializer=_inherit, initargs=(self.records,))
        # The workers fork at the first submit. Frozen objects are left alone by a worker's garbage
        # collector, which would otherwise write to every page of the records and so copy them all.
        gc.freeze()
        try:
            return self.pool.submit(_run_inherited, task, args)
        finally:
            gc.unfreeze()

    def close(self) -> None:
        """Parts not started are dropped (the writer failed, or is done); the workers exit."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
