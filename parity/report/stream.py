"""The per-case half of a report, made as each verdict arrives: its verdict dict and its lines of
results.jsonl, in a thread of their own while the ranks run the next cases.

Made at the end, after the last case, they were most of what a run spent writing its report (on
the 2-core EPYC, of 6.4 s for the default matrix: the verdict dicts 1.1 s, results.jsonl 2.6 s).
Each depends on its own case alone, so nothing waits for the run to end; what is left for the end
(parity.report.console.write_report) is what needs every case: the summaries, the figures of the
failing and nearest cases, report.html. The lines are the bytes write_results makes from the same
dicts (tests/report/test_writer_golden.py writes the golden report through the stream).
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor


def encoder():
    """One results.jsonl line per row: one encoder for every line (json.dumps with options builds a
    new one per call)."""
    return json.JSONEncoder(default=str, separators=(",", ":")).encode


def results_text(record: dict, encode=None) -> str:
    """A case's lines of results.jsonl."""
    from parity.report import environment as env
    from parity.report.records import result_lines

    encode = encode or encoder()
    return "".join(encode({"schema_version": env.SCHEMA_VERSION, **row}) + "\n" for row in result_lines(record))


class ReportStream:
    """add() each verdict (or verdict dict) as it comes; parts() gives the verdict dicts and their
    results.jsonl text, in the order added. reset() starts over (parity run --passes: the report
    is the last pass's)."""

    def __init__(self):
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-report")
        self._encode = encoder()
        self._parts: list = []

    def add(self, verdict_or_record) -> None:
        self._parts.append(self._thread.submit(self._make, verdict_or_record))

    def _make(self, item) -> tuple[dict, str]:
        record = item if isinstance(item, dict) else item.as_dict()
        return record, results_text(record, self._encode)

    def reset(self) -> None:
        self._parts = []

    def parts(self, count: int | None = None) -> tuple[list[dict], list[str]]:
        """(verdict dicts, results.jsonl texts) of the first `count` added (all by default): a run
        stopped by Ctrl-C or --maxfail reports the verdicts it kept."""
        made = [f.result() for f in self._parts[:count]]
        return [r for r, _ in made], [t for _, t in made]

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
