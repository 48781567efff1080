"""Does a DeepSpeed fix fix its finding, and move nothing else?

    python ci/try_fix.py fixes/deepspeed/unfused_grad_norm_tp.patch [PATCH ...] [--rejected PATCH ...]

A patch is a unified diff against the installed deepspeed package (paths a/deepspeed/..., b/deepspeed/...) whose
first line names the finding it fixes (``Finding: <name>``, the name verdicts give it). For each one, as the README's
"Testing a DeepSpeed change" does with a checkout, a copy of the installed deepspeed with the patch applied goes first
on PYTHONPATH, and:
  1. every reproducer of the finding must exit 0;
  2. every case marked with the finding must read it fixed, and against a baseline run on the installed deepspeed
     no other finding of those cases, and no verdict of a fixed regression selection, may change.
A patch passing both is ACCEPTED. Exit 0 when every patch is accepted and every --rejected patch is rejected (a
plausible fix that the suite must tell from a right one).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from parity.matrix.cases import load  # noqa: E402
from parity.subjects import SUBJECTS  # noqa: E402

REGRESSION_EVERY = 100  # every 100th DeepSpeed case of the default matrix: the selection no fix may move


def finding_of(patch: Path) -> str:
    found = re.search(r"^Finding: (\S+)", patch.read_text(), re.M)
    if not found:
        raise SystemExit(f"{patch}: no 'Finding: <name>' line before the diff")
    return found.group(1)


def marked_cases(cases, finding: str) -> list:
    return [c for c in cases if c.divergence is not None and finding in [f.name for f in c.divergence.findings]]


def reproducers(cases, finding: str) -> list[str]:
    return sorted({f.repro for c in marked_cases(cases, finding) for f in c.divergence.findings if f.name == finding})


def regression_selection(cases) -> list:
    engine = [c for c in cases if SUBJECTS[c.subject].framework == "deepspeed"]
    return engine[::REGRESSION_EVERY]


def patched_copy(patch: Path, into: Path) -> Path:
    import deepspeed

    installed = Path(deepspeed.__file__).resolve().parent
    shutil.copytree(installed, into / "deepspeed", ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    applied = subprocess.run(["patch", "-p1", "-s", "-d", str(into), "-i", str(patch.resolve())],
                             capture_output=True, text=True)
    if applied.returncode:
        raise SystemExit(f"{patch}: does not apply to deepspeed {deepspeed.__version__} at {installed}:\n"
                         f"{applied.stdout}{applied.stderr}")
    return into


def run_cases(case_ids, report: Path, pythonpath: Path | None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH")) if p)
    args = [sys.executable, "-m", "parity.cli", "run", "--report", str(report)]
    subprocess.run(args + [a for i in case_ids for a in ("--case", i)], cwd=ROOT, env=env, capture_output=True,
                   text=True, timeout=1800)
    summary = json.loads((report / "summary.json").read_text())
    return {c["id"]: c for c in summary["cases"]}


def judge(finding: str, marked: list, base: dict, mine: dict) -> list[str]:
    """What is wrong with the patched run: the finding still present, or anything else moved."""
    problems = []
    marked_ids = {c.id for c in marked}
    for case_id, before in base.items():
        after = mine.get(case_id)
        if after is None:
            problems.append(f"{case_id}: not run with the patch")
            continue
        if before["verdict"] == "skipped":
            continue
        found_before, found_after = before.get("findings") or {}, after.get("findings") or {}
        if case_id in marked_ids:
            if found_after.get(finding) != "fixed":
                problems.append(f"{case_id}: {finding} still {found_after.get(finding)} ({after['verdict']}: "
                                f"{(after.get('reason') or after.get('first_failure') or '')[:200]})")
            others = {k: v for k, v in found_after.items() if k != finding}
            if others != {k: v for k, v in found_before.items() if k != finding}:
                problems.append(f"{case_id}: other findings moved {found_before} -> {found_after}")
            if after["verdict"] == "failed":
                problems.append(f"{case_id}: failed ({(after.get('reason') or after.get('first_failure') or '')[:200]})")
        elif (before["verdict"], found_before) != (after["verdict"], found_after):
            problems.append(f"{case_id}: {before['verdict']} -> {after['verdict']} "
                            f"({(after.get('first_failure') or after.get('reason') or '')[:200]})")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="try_fix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("patches", nargs="*", type=Path, help="fixes expected to be accepted")
    parser.add_argument("--rejected", nargs="*", default=[], type=Path, help="fixes the suite must reject")
    parser.add_argument("--json", type=Path, help="write each patch's outcome here")
    args = parser.parse_args(argv)
    cases = load()
    regression = regression_selection(cases)
    plan = {p: finding_of(p) for p in [*args.patches, *args.rejected]}
    outcomes, ok = {}, True
    with tempfile.TemporaryDirectory(prefix="try_fix_") as tmp:
        tmp = Path(tmp)
        every = list(dict.fromkeys([c.id for c in regression]
                                   + [c.id for f in plan.values() for c in marked_cases(cases, f)]))
        base = run_cases(every, tmp / "base", None)
        for index, (patch, finding) in enumerate(plan.items()):
            marked = marked_cases(cases, finding)
            if not marked:
                raise SystemExit(f"{patch}: no case of the default matrix is marked with finding {finding!r}")
            copy = patched_copy(patch, tmp / f"patched{index}")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(copy), os.environ.get("PYTHONPATH"))
                                                              if p)}
            problems = []
            for repro in reproducers(cases, finding):
                done = subprocess.run([sys.executable, repro], cwd=ROOT, env=env, capture_output=True, text=True,
                                      timeout=600)
                if done.returncode:
                    problems.append(f"{repro}: exit {done.returncode}: {(done.stdout + done.stderr).strip()[-300:]}")
            ids = list(dict.fromkeys([c.id for c in regression] + [c.id for c in marked]))
            mine = run_cases(ids, tmp / f"mine{index}", copy)
            problems += judge(finding, marked, {i: base[i] for i in ids}, mine)
            accepted = not problems
            expected = patch not in args.rejected
            ok = ok and accepted == expected
            outcomes[str(patch)] = {"finding": finding, "accepted": accepted, "expected_accepted": expected,
                                    "cases": len(ids), "marked": len(marked), "problems": problems}
            print(f"{'ACCEPTED' if accepted else 'REJECTED'}  {patch}  ({finding}: {len(marked)} marked cases, "
                  f"{len(ids)} run){'' if accepted == expected else '  <- UNEXPECTED'}")
            for line in problems[:8]:
                print(f"    {line}")
            if len(problems) > 8:
                print(f"    ... {len(problems) - 8} more")
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
