"""Two commands timed in turn, A B A B ..., as whole processes: wall, CPU and peak RSS of each run
from the operating system's accounting (wait4), the medians, and the ratio A/B pair by pair, so the
ratio holds while a shared machine's speed drifts. Standard library only.

  python ci/bench_pair.py [--runs N] [--warmup N] --a 'OLD COMMAND' --b 'NEW COMMAND'

Each command is split as a shell splits words and run without a shell; its output goes to
--log (default: thrown away). Exit status 1 when a run exits non-zero (its status is printed).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(argv: list[str], log, figure: str | None) -> dict:
    """One run; figure: a regex whose first group, found in the command's output, is a number it
    measured itself (e.g. the seconds one part took), reported beside wall, CPU and RSS."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        out.seek(0)
        text = out.read()
    log.write(text)
    result = {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
              "rss_mib": usage.ru_maxrss / 1024.0,  # KiB on Linux: the largest process of the tree
              "status": os.waitstatus_to_exitcode(status)}
    if figure:
        found = re.search(figure, text)
        result["figure"] = float(found.group(1)) if found else float("nan")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="the baseline command (old)")
    parser.add_argument("--b", required=True, help="the command measured against it (new)")
    parser.add_argument("--runs", type=int, default=3, help="counted runs of each (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted runs of each first (default 1)")
    parser.add_argument("--log", default=os.devnull, help="file both commands' output is appended to")
    parser.add_argument("--label", default="", help="what is measured, for the printed lines")
    parser.add_argument("--figure", help="regex with one group: a number each command prints about itself "
                                         "(e.g. 'in ([0-9.]+) s'), compared like the others")
    args = parser.parse_args(argv)
    a, b = shlex.split(args.a), shlex.split(args.b)
    runs = {"A": [], "B": []}
    failed = False
    with open(args.log, "a") as log:
        for i in range(args.warmup + args.runs):
            for name, cmd in (("A", a), ("B", b)):
                log.write(f"\n=== run {i} {name}: {shlex.join(cmd)}\n")
                log.flush()
                result = run_once(cmd, log, args.figure)
                failed |= result["status"] != 0
                if i >= args.warmup:
                    runs[name].append(result)
                print(f"{args.label} run {i}{' (warm-up)' if i < args.warmup else ''} {name}: "
                      f"{result['wall']:.2f} s wall, {result['cpu']:.2f} s cpu, exit {result['status']}", flush=True)
    print(f"{args.label} A = {args.a}\n{args.label} B = {args.b}")
    for key in ("wall", "cpu", "rss_mib") + (("figure",) if args.figure else ()):
        ra, rb = [r[key] for r in runs["A"]], [r[key] for r in runs["B"]]
        ratios = [x / y for x, y in zip(ra, rb) if y]
        spread = (f"min {min(ratios):.2f} median {statistics.median(ratios):.2f} max {max(ratios):.2f}"
                  if ratios else "n/a (B measured 0)")
        print(f"{args.label} {key}: A median {statistics.median(ra):.2f}, B median {statistics.median(rb):.2f}, "
              f"A/B pair by pair {spread}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
