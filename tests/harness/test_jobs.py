"""parity run -j N, with references shared and overlapped with rank work, gives what the old harness
(-j 1 --no-reference-cache: one case at a time, every reference computed after its ranks are done)
gives: the same verdicts in the same order and a bitwise identical results.jsonl, on a selection
that mixes world sizes 2 and 3, skips, a rejection and a known divergence."""
import json

from parity.checks import compare
from parity.harness.runner import Runner, default_jobs
from parity.matrix.cases import load
from parity.report.records import result_lines


def mixed_selection():
    cases, picked = load(), []
    rules = [
        lambda c: c.subject == "column_gathered" and c["tp"] == 3 and c["dtype"] == "fp32" and c["zero"] == 0,
        lambda c: c.subject == "ds_vocab_ce" and c["dtype"] == "bf16" and c["tp"] == 2,
        lambda c: c.subject == "ds_reject",
        lambda c: c.divergence is not None and c.subject != "liger_vocab_ce",
        lambda c: c.values.get("device") == "cuda",
    ]
    for rule in rules:
        picked += [c for c in cases if rule(c) and c not in picked and c.world_size <= 3][:2]
    return picked


def _results(cases, jobs, baseline=False, monkeypatch=None):
    compare.clear_reference_cache()  # each run computes its own references, as a fresh process would
    if baseline:
        monkeypatch.setattr(compare, "REFERENCE_CACHE_SIZE", 0)
    runner = Runner(timeout_s=120, overlap_reference=not baseline)
    try:
        verdicts = list(runner.run_all(cases, jobs))
    finally:
        runner.close()
        monkeypatch and monkeypatch.undo()
    lines = [json.dumps(line, default=str, separators=(",", ":")) for v in verdicts
             for line in result_lines(v.as_dict())]
    return [(v.case.id, v.status, v.reason) for v in verdicts], "\n".join(lines)


def test_parallel_jobs_give_the_serial_results_bitwise(monkeypatch):
    cases = mixed_selection()
    assert {c.world_size for c in cases} == {2, 3} and any(c.divergence for c in cases)
    serial, serial_lines = _results(cases, 1, baseline=True, monkeypatch=monkeypatch)
    assert not compare._reference_cache  # the baseline kept no reference
    parallel, parallel_lines = _results(cases, 2)
    assert parallel == serial
    assert parallel_lines == serial_lines
    assert [s for _, s, _ in serial].count("passed") >= 4 and "skipped" in [s for _, s, _ in serial]


def test_default_jobs_gives_every_rank_of_the_largest_group_a_core(monkeypatch):
    cases = [c for c in load() if c.world_size == 2][:1] + [c for c in load() if c.world_size == 4][:1]
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert default_jobs(cases) == 4
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert default_jobs(cases) == 1
