"""parity list | run | diff | mutants | bench: the command-line face of the suite."""
from __future__ import annotations

import argparse
import json
import sys
import time

from parity.matrix.cases import CaseFileError, load, select


def cmd_list(args) -> int:
    cases = select(load(args.matrix), args.k, args.case, args.device)
    if args.coverage:
        from parity.matrix.coverage import coverage_table

        print(coverage_table(cases))
        return 0
    if args.json:
        print(json.dumps([c.as_dict() for c in cases], indent=1))
    else:
        for c in cases:
            print(c.id)
        print(f"{len(cases)} cases", file=sys.stderr)
    return 0


def cmd_run(args) -> int:
    from parity.report.console import Progress, summary_table, write_report
    from parity.harness.runner import Runner, default_jobs, strict_from_env

    if args.launcher == "torchrun":
        from parity.torchrun_launch import cmd_run_torchrun

        return cmd_run_torchrun(args)
    cases = select(load(args.matrix), args.k, args.case, args.device)
    if not cases:
        print("parity: no cases selected", file=sys.stderr)
        return 2
    strict = args.strict or strict_from_env()
    runner = Runner(timeout_s=args.timeout, strict=strict, log_dir=args.logs)
    progress = Progress(len(cases))
    if args.no_reference_cache:  # the harness as it was before the cache: the benchmark's baseline
        from parity.checks import compare

        compare.REFERENCE_CACHE_SIZE = 0
    jobs = args.jobs or default_jobs(cases)
    print(f"running {len(cases)} cases" + (f", {jobs} at once" if jobs > 1 else "")
          + (" (strict: skips fail)" if strict else ""), flush=True)
    start = time.monotonic()
    verdicts = []
    try:
        for verdict in runner.run_all(cases, jobs):
            verdicts.append(verdict)
            progress.update(verdict)
    finally:
        runner.close()
    wall = time.monotonic() - start
    print(summary_table(verdicts, wall))
    if args.report:
        write_report(args.report, [v.as_dict() for v in verdicts], wall, ["parity", *args.argv])
        print(f"wrote {args.report}/: summary.json, results.jsonl, summary.md, report.html")
    return 1 if any(v.status == "failed" for v in verdicts) else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["mutants"]:  # its own options: see parity/mutation/check.py
        from parity.mutation.check import main as mutants_main

        return mutants_main(argv[1:])
    parser = argparse.ArgumentParser(prog="parity", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("mutants", help="mutation check: planted bugs the suite must catch (mutants --help)")
    for name in ("list", "run"):
        p = sub.add_parser(name)
        p.add_argument("--matrix", action="append", help="case file (repeatable; default: cases/*.toml)")
        p.add_argument("-k", metavar="EXPR", help="select cases by id, pytest -k syntax")
        p.add_argument("--case", action="append", metavar="ID", help="run exactly this case (repeatable)")
        p.add_argument("--device", choices=("cpu", "cuda"), help="only cases on this device")
    sub.choices["list"].add_argument("--json", action="store_true")
    sub.choices["list"].add_argument("--coverage", action="store_true",
                                     help="print the subject x axis coverage table (markdown, as in the README)")
    run = sub.choices["run"]
    run.add_argument("--report", metavar="DIR", help="write DIR/summary.json, results.jsonl, summary.md, report.html")
    run.add_argument("--strict", action="store_true", help="a skip is a failure (also PARITY_STRICT=1)")
    run.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take on its ranks")
    run.add_argument("-j", "--jobs", type=int, default=0, metavar="N",
                     help="rank groups running cases at once (default: cores // the largest selected world size; "
                          "results are the same for every N)")
    run.add_argument("--no-reference-cache", action="store_true",
                     help="compute every case's reference afresh (the baseline `-j 1 --no-reference-cache` is "
                          "the harness before references were shared; results are the same)")
    run.add_argument("--logs", metavar="DIR", help="where rank logs go (default: a temp dir)")
    run.add_argument("--launcher", choices=("spawn", "torchrun"), default="spawn",
                     help="spawn: parity starts its own rank groups (default); torchrun: this process is one "
                          "rank of `torchrun ... -m parity.cli run --launcher torchrun` (parity/torchrun_launch.py)")
    from parity.report.diff import add_arguments as add_diff_arguments

    add_diff_arguments(sub.add_parser("diff", help="compare two report directories; exits 1 if a verdict got worse"))
    bench = sub.add_parser("bench", help="print CE backend figures (time, peak memory); not a test")
    from parity.bench import add_arguments

    add_arguments(bench)
    args = parser.parse_args(argv)
    args.argv = argv  # for the report: the command as typed
    if args.command == "diff":
        from parity.report.diff import cmd_diff

        return cmd_diff(args)
    if args.command == "bench":
        from parity.bench import cmd_bench

        return cmd_bench(args)
    try:
        return {"list": cmd_list, "run": cmd_run}[args.command](args)
    except CaseFileError as exc:
        print(f"parity: bad case file: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
