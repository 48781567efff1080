"""Merge the sensitivity.json of several `parity sensitivity` runs (run_on_device.sh's groups) into one
sensitivity.json / sensitivity.md, written by the same code as a single run's (parity.sensitivity.write_report).
A case measured by several runs takes the entry of the last run named (a re-measure after a change).

    python results/sensitivity/full/merge.py RUN/sensitivity.json ... --report DIR
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root: parity is importable from here
from parity.sensitivity import write_report  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("runs", nargs="+", type=Path)
parser.add_argument("--report", required=True, type=Path)
args = parser.parse_args()
runs = [json.loads(p.read_text()) for p in args.runs]
entries = list({e["id"]: e for r in runs for e in r["cases"]}.values())
measured = {e["id"] for e in entries}
skipped = [e for r in runs for e in r["skipped"] if e["id"] not in measured]
command = " ; ".join(r["command"] for r in runs)
print(write_report(args.report, entries, skipped, command, max(r["seconds"] for r in runs)))
