"""Writing a report, timed apart from running the cases: the same verdict dicts, written by any tree.

  capture OUT.json.gz [-k EXPR] [--case ID ...] [--device cpu] [-j N]
      run the selection once and save every case's verdict dict (Verdict.as_dict(), the input of
      parity.report.console.write_report) as gzipped JSON.
  write RECORDS.json.gz DIR [--scale N]
      write the report of those verdicts into DIR and print how long it took. --scale N repeats
      them (ids suffixed ~1, ~2, ...) to N cases, to stand in for the default matrix (about 2000)
      where running it is too slow. Run under PYTHONPATH=OLD_TREE, it times OLD_TREE's writer on the
      same input: ci/bench_speed.sh does both, old and new in turn. A tree whose parity run makes
      each case's share of the report as its verdict arrives (parity.report.stream) does that
      first, timed apart ("made case by case"): in a run it overlaps the cases still running, so
      "wrote the report ... in S s" is what is left after the last case, as in parity run.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time


def capture(args) -> int:
    from parity.harness.job_processes import job_runner
    from parity.harness.runner import default_jobs
    from parity.matrix.cases import load, select

    cases = select(load(args.matrix), args.k, args.case, args.device)
    if not cases:
        print("bench_report: no cases selected", file=sys.stderr)
        return 2
    runner = job_runner(args.jobs or default_jobs(cases))
    try:
        records = [v.as_dict() for v in runner.run_all(cases)]
    finally:
        runner.close()
    with gzip.open(args.out, "wt") as out:
        json.dump(records, out)
    print(f"saved {len(records)} verdict dicts to {args.out}")
    return 0


def scaled(records: list[dict], n: int) -> list[dict]:
    """n verdict dicts: the records over and over, each copy's ids made unique."""
    out = []
    for i in range(n):
        r = dict(records[i % len(records)])  # the writers only read a record: its checks may be shared
        if i >= len(records):
            r["id"] = f"{r['id']}~{i // len(records)}"
        out.append(r)
    return out


def write(args) -> int:
    import parity
    from parity.observe import capabilities
    from parity.report.console import write_report

    # A run has probed the machine before it writes its report (its cases needed the answers, and
    # parity run --report gathers them while its cases run). The probes are child processes that
    # import torch, about 10 CPU seconds that no report's writing pays and that would only dilute
    # whole-process timings of this command: answered without probing, alike for any tree.
    for name in capabilities.PROBES:
        capabilities.PROBES[name] = lambda: "not probed (ci/bench_report.py write)"

    with gzip.open(args.records, "rt") as f:
        records = json.load(f)
    if args.scale:
        records = scaled(records, args.scale)
    texts = None
    try:
        from parity.report.stream import ReportStream
    except ImportError:  # a tree from before the stream: all of it is written at the end
        ReportStream = None
    if ReportStream is not None:
        start = time.monotonic()
        stream = ReportStream()
        for record in records:
            stream.add(record)
        records, texts = stream.parts()
        stream.close()
        print(f"made case by case (as verdicts arrive): {len(records)} cases in {time.monotonic() - start:.2f} s")
    start = time.monotonic()
    if texts is None:
        write_report(args.out, records, 0.0, ["bench_report"])
    else:
        write_report(args.out, records, 0.0, ["bench_report"], results_texts=texts)
    took = time.monotonic() - start
    print(f"wrote the report of {len(records)} cases in {took:.2f} s (parity from {parity.__file__})")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture", help="run a selection and save its verdict dicts")
    cap.add_argument("out")
    cap.add_argument("--matrix", action="append", help="case file (repeatable; default: cases/*.toml)")
    cap.add_argument("-k", help="pytest -k expression over case ids")
    cap.add_argument("--case", action="append", help="a case id (repeatable)")
    cap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    cap.add_argument("-j", "--jobs", type=int, default=0)
    wr = sub.add_parser("write", help="write the report of saved verdict dicts, timed")
    wr.add_argument("records")
    wr.add_argument("out")
    wr.add_argument("--scale", type=int, default=0, help="repeat the verdicts to this many cases")
    args = parser.parse_args(argv)
    return capture(args) if args.command == "capture" else write(args)


if __name__ == "__main__":
    sys.exit(main())
