"""Bitwise behaviour gate for refactors: run a fixed selection of the default matrix and print the sha256 of its
results.jsonl, its row count and its verdict counts. Two checkouts whose refactor changed nothing print the same.

Selection: every 6th id of `parity list` (default matrix), plus the first case of each subject that list misses.
The checkout run is the one holding this file (its root goes first on PYTHONPATH), whatever --python is.

    python ci/bitwise_gate.py REPORT_DIR [--python PY] [--jobs N] [--extensions-dir DIR]
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parity(python: str, *args: str, extensions: str | None = None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if extensions:
        env["TORCH_EXTENSIONS_DIR"] = extensions
    return subprocess.run([python, "-m", "parity.cli", *args], cwd=ROOT, env=env, text=True, **kw)


def selection(python: str) -> list[str]:
    """Every 6th case id, plus each subject's first case when none of its cases is among them."""
    out = parity(python, "list", "--json", capture_output=True, check=True).stdout
    cases = json.loads(out)
    picked = [c["id"] for c in cases[::6]]
    chosen = set(picked)
    covered = {c["subject"] for c in cases if c["id"] in chosen}
    for c in cases:
        if c["subject"] not in covered:
            covered.add(c["subject"])
            picked.append(c["id"])
    return picked


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report_dir")
    ap.add_argument("--python", default=sys.executable, help="interpreter with the suite's dependencies")
    ap.add_argument("--jobs", "-j", default="2")
    # JIT-built ops (DeepSpeed's shm op) in a cache only gate runs share: a rank waiting on another process's
    # rebuild of the shared cache would time its case out in one run and not the other.
    ap.add_argument("--extensions-dir", default=os.path.join(tempfile.gettempdir(), "parity-gate-torch-extensions"))
    args = ap.parse_args(argv)
    ids = selection(args.python)
    print(f"selection: {len(ids)} cases", flush=True)
    run = parity(args.python, "run", "--report", args.report_dir, "-j", args.jobs,
                 *[a for i in ids for a in ("--case", i)], extensions=args.extensions_dir)
    results = Path(args.report_dir) / "results.jsonl"
    data = results.read_bytes()
    verdicts = collections.Counter(c["verdict"] for c in json.loads((Path(args.report_dir) / "summary.json")
                                                                    .read_text())["cases"])
    print(f"parity run exit {run.returncode}")
    print(f"sha256 {hashlib.sha256(data).hexdigest()}  {results}")
    print(f"rows {len(data.splitlines())}")
    print("verdicts " + " ".join(f"{k}={v}" for k, v in sorted(verdicts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
