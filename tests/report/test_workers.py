"""The report's parts in forked workers (parity.report.workers): each runs in another process, on
the records as they were when the workers forked, and its answer or its error comes back to the
writer; with 0 workers each runs here."""
import os

import pytest

from parity.report.workers import Parts


def where_and_what(records, key):
    return os.getpid(), [r[key] for r in records]


def fails(records):
    raise ValueError(f"planted failure after {len(records)} records")


@pytest.mark.parametrize("workers", [1, 2])
def test_parts_run_in_forked_workers_on_the_records_as_they_were(workers):
    records = [{"id": f"case-{i}"} for i in range(5)]
    with Parts(records, workers) as parts:
        pending = [parts.submit(where_and_what, "id") for _ in range(4)]
        records.append({"id": "added after the fork"})  # the workers' copy is the one they forked with
        done = [p.result() for p in pending]
    pids = {pid for pid, _ in done}
    assert os.getpid() not in pids and len(pids) <= workers
    assert all(ids == [f"case-{i}" for i in range(5)] for _, ids in done)


def test_with_no_workers_each_part_runs_here_when_asked():
    records = [{"id": "a"}]
    with Parts(records, 0) as parts:
        part = parts.submit(where_and_what, "id")
        records.append({"id": "b"})
        assert part.result() == (os.getpid(), ["a", "b"])


@pytest.mark.parametrize("workers", [0, 1])
def test_a_failing_part_raises_where_its_result_is_asked_for(workers):
    with Parts([{}, {}], workers) as parts:
        part = parts.submit(fails)
        with pytest.raises(ValueError, match="planted failure after 2 records"):
            part.result()
