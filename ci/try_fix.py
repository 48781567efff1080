"""Does a DeepSpeed fix fix its finding, and move nothing else?

    python ci/try_fix.py fixes/deepspeed/unfused_grad_norm_tp.patch [PATCH ...] [--rejected PATCH ...]

A patch is a unified diff against the installed deepspeed package (paths a/deepspeed/..., b/deepspeed/...) whose
first line names the finding it fixes (``Finding: <name>``, the name verdicts give it). For each one, as the README's
"Testing a DeepSpeed change" does with a checkout, a copy of the installed deepspeed with the patch applied goes first
on PYTHONPATH, and:
  1. every reproducer of the finding must exit 0;
  2. on the finding's cases and their neighbourhood (every case of a marked subject with at most 100 cases) and a
     fixed regression selection, every case marked with the finding must read it fixed (or show it only through checks another finding still
     present there explains too), and against a baseline run on the installed deepspeed no verdict may get worse
     and no finding become present anywhere; another finding it fixes too is reported, not held against it.
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
from parity.matrix.cases import findings, load  # noqa: E402
from parity.subjects import SUBJECTS  # noqa: E402

REGRESSION_EVERY = 100  # every 100th DeepSpeed case of the default matrix: the selection no fix may move
NEIGHBOURHOOD = 100  # and every case of each subject the finding marks that has at most this many cases


def finding_of(patch: Path) -> str:
    found = re.search(r"^Finding: (\S+)", patch.read_text(), re.M)
    if not found:
        raise SystemExit(f"{patch}: no 'Finding: <name>' line before the diff")
    return found.group(1)


def marked_cases(cases, finding: str) -> list:
    return [c for c in cases if c.divergence is not None and finding in [f.name for f in c.divergence.findings]]


def reproducers(finding: str) -> list[str]:
    return findings()[finding]["reproducers"]


def regression_selection(cases) -> list:
    engine = [c for c in cases if SUBJECTS[c.subject].framework == "deepspeed"]
    return engine[::REGRESSION_EVERY]


def neighbourhood(cases, marked) -> list:
    """Where a fix is likeliest to break something else: every case of the marked cases' smaller subjects (a
    config-refusal fix meets every other refusal of ds_reject, a norm fix every tied head)."""
    sizes = {}
    for c in cases:
        sizes[c.subject] = sizes.get(c.subject, 0) + 1
    near = {c.subject for c in marked if sizes[c.subject] <= NEIGHBOURHOOD}
    return [c for c in cases if c.subject in near]


def patched_copy(patch: Path, into: Path) -> Path:
    import deepspeed

    installed = Path(deepspeed.__file__).resolve().parent
    shutil.copytree(installed, into / "deepspeed", ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    applied = subprocess.run(["git", "apply", "-p1", str(patch.resolve())], cwd=into, capture_output=True, text=True)
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


def masked(case, finding: str, statuses: dict, failed: tuple) -> bool:
    """The finding reads present only through checks that another finding still present there explains too."""
    parts = {f.name: f for f in case.divergence.findings}
    own = [c for c in failed if parts[finding].covers(c)]
    others = [f for name, f in parts.items() if name != finding and statuses.get(name) == "present"]
    return bool(own) and all(any(f.covers(c) for f in others) for c in own)


def failed_check_names(report: Path) -> dict:
    """Case id -> the names of its failed checks (results.jsonl)."""
    failed = {}
    for line in (report / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("check") and row.get("passed") is False:
            failed.setdefault(row["case"], []).append(row["check"])
    return failed


def judge(finding: str, marked: list, base: dict, mine: dict, failed_checks: dict) -> tuple[list[str], list[str]]:
    """What is wrong with the patched run (the finding still present, a verdict worse or a finding newly present
    anywhere), and what else it fixed (another finding present before, fixed now)."""
    problems, also = [], []
    marked_by_id = {c.id: c for c in marked}
    for case_id, before in base.items():
        after = mine.get(case_id)
        if after is None:
            problems.append(f"{case_id}: not run with the patch")
            continue
        if before["verdict"] == "skipped":
            continue
        found_before, found_after = before.get("findings") or {}, after.get("findings") or {}
        reason = (after.get("reason") or after.get("first_failure") or "")[:200]
        for name in dict.fromkeys([*found_before, *found_after]):
            if name == finding:
                continue
            if found_before.get(name) == "present" and found_after.get(name) == "fixed":
                also.append(f"{case_id}: {name}")
            elif found_after.get(name) == "present" and found_before.get(name) != "present":
                problems.append(f"{case_id}: {name} newly present ({after['verdict']}: {reason})")
        if after["verdict"] == "failed" and before["verdict"] != "failed":
            problems.append(f"{case_id}: {before['verdict']} -> failed ({reason})")
        elif after["verdict"] != before["verdict"] and not (found_after and after["verdict"] in ("diverged", "xpassed")):
            problems.append(f"{case_id}: {before['verdict']} -> {after['verdict']} ({reason})")
        if case_id in marked_by_id and found_after.get(finding) != "fixed" and not (
                found_after.get(finding) == "present"
                and masked(marked_by_id[case_id], finding, found_after, failed_checks.get(case_id, ()))):
            problems.append(f"{case_id}: {finding} still {found_after.get(finding)} ({after['verdict']}: {reason})")
    if not any((mine.get(c.id) or {}).get("findings", {}).get(finding) == "fixed" for c in marked):
        problems.append(f"no case marked with {finding} reads it fixed")
    return problems, also


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
        every = list(dict.fromkeys([c.id for c in regression] + [
            c.id for f in plan.values() for c in marked_cases(cases, f) + neighbourhood(cases, marked_cases(cases, f))]))
        base = run_cases(every, tmp / "base", None)
        for index, (patch, finding) in enumerate(plan.items()):
            marked = marked_cases(cases, finding)
            if not marked:
                raise SystemExit(f"{patch}: no case of the default matrix is marked with finding {finding!r}")
            copy = patched_copy(patch, tmp / f"patched{index}")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(copy), os.environ.get("PYTHONPATH"))
                                                              if p)}
            problems = []
            for repro in reproducers(finding):
                done = subprocess.run([sys.executable, repro], cwd=ROOT, env=env, capture_output=True, text=True,
                                      timeout=600)
                if done.returncode:
                    problems.append(f"{repro}: exit {done.returncode}: {(done.stdout + done.stderr).strip()[-300:]}")
            ids = list(dict.fromkeys([c.id for c in regression] + [c.id for c in marked + neighbourhood(cases, marked)]))
            mine = run_cases(ids, tmp / f"mine{index}", copy)
            found, also = judge(finding, marked, {i: base[i] for i in ids}, mine, failed_check_names(tmp / f"mine{index}"))
            problems += found
            accepted = not problems
            expected = patch not in args.rejected
            ok = ok and accepted == expected
            outcomes[str(patch)] = {"finding": finding, "accepted": accepted, "expected_accepted": expected,
                                    "cases": len(ids), "marked": len(marked), "problems": problems, "also_fixed": also}
            print(f"{'ACCEPTED' if accepted else 'REJECTED'}  {patch}  ({finding}: {len(marked)} marked cases, "
                  f"{len(ids)} run){'' if accepted == expected else '  <- UNEXPECTED'}")
            for line in problems[:8]:
                print(f"    {line}")
            if also:
                print(f"    also fixes, on {len(also)} case(s): {', '.join(sorted({a.split(': ')[1] for a in also}))}")
            if len(problems) > 8:
                print(f"    ... {len(problems) - 8} more")
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
