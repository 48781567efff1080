"""parity sensitivity: the smallest planted error each check kind catches, measured.

    parity sensitivity [-k EXPR] [--case ID] [--matrix F] --report DIR

Each selected parity case runs once on its ranks. In this process the recorded observations of one
rank (the last; TP rank > 0 where there is one) are then perturbed (parity/checks/perturb.py: a
systematic relative scale, one element, one shard) and judged again by the same checks. For each
observable x mode the smallest eps caught is found by bisection on a log scale between MIN_EPS and
perturb.MAX_EPS. "Caught" means a check *of that observable* fails that passed unperturbed: its
own numerical checks (end-to-end, stage-local, assembled), not the bitwise ones (replicas_agree,
initial weights, the fp32 SGD identity), which catch any one-rank change and measure no bound.
The first check kind that catches at the threshold is recorded too.

Writes DIR/sensitivity.json (every case's thresholds, its baseline worst ratio per dtype) and
DIR/sensitivity.md (the worst threshold over the cases per observable x mode x dtype, against the
targets). A case whose unperturbed checks fail is listed as such and measures nothing.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from parity.checks import perturb
from parity.checks.compare import compare, reference_pair
from parity.checks.tolerances import SENSITIVITY_TARGETS
from parity.harness.runner import Runner
from parity.matrix.cases import SelectionError, load, select
from parity.subjects import SUBJECTS

MIN_EPS = 1e-9
BISECTIONS = 10  # the log interval [1e-9, 2] narrowed to a factor of about 1.02 (each step is one judging of the case)


def add_arguments(parser) -> None:
    parser.add_argument("--matrix", action="append", help="case file (repeatable; default: cases/*.toml)")
    parser.add_argument("-k", metavar="EXPR", help="select cases by id, pytest -k syntax")
    parser.add_argument("--case", action="append", metavar="ID", help="measure exactly this case (repeatable)")
    parser.add_argument("--report", metavar="DIR", required=True, help="write DIR/sensitivity.json and sensitivity.md")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take on its ranks")


# Checks computed from an observable that carry no record kind's name: the SGD identity holds the
# updated weights to the rank's own gradient (the stage gradient -> update); the reported clipping
# norm is a function of the gradient.
DERIVED_CHECKS = {"sgd_update": ("weight", "weight_grad"), "grad_norm": ("weight_grad",)}


def belongs(check_name: str, observable: str) -> bool:
    """A check of this observable: its record kinds, their stage-local and assembled checks."""
    base = check_name.split("[")[0]
    if base in DERIVED_CHECKS:
        return observable in DERIVED_CHECKS[base]
    if base == "assembled":
        base = check_name[len("assembled["):].rstrip("]")
    base = base.removesuffix("_stage")
    return base in perturb.OBSERVABLES[observable]


def _key(check) -> tuple:
    return (check.name, check.step, check.micro, check.rank)


def caught_by(checks, observable: str, baseline_failed: set) -> list[str]:
    return sorted({c.name.split("[")[0] for c in checks
                   if not c.passed and _key(c) not in baseline_failed and belongs(c.name, observable)})


def threshold(judge, observable: str, mode: str, baseline_failed: set) -> tuple[float | None, list[str]]:
    """Smallest eps in [MIN_EPS, MAX_EPS] that a check of ``observable`` catches (bisection in log eps;
    detection is monotone in eps for these bounds). None: not caught even at the largest eps."""
    hi = perturb.MAX_EPS[mode]
    top = caught_by(judge(observable, mode, hi), observable, baseline_failed)
    if not top:
        return None, []
    low = caught_by(judge(observable, mode, MIN_EPS), observable, baseline_failed)
    if low:
        return MIN_EPS, low
    lo, by = MIN_EPS, top
    for _ in range(BISECTIONS):
        mid = math.sqrt(lo * hi)
        found = caught_by(judge(observable, mode, mid), observable, baseline_failed)
        if found:
            hi, by = mid, found
        else:
            lo = mid
    return hi, by


def measure_case(case, outcome, references=None) -> dict:
    """references: the runner's ReferenceCache (None: the pair computed afresh)."""
    subject = SUBJECTS[case.subject]
    values = case.values
    reference, oracle = references.pair(subject, values) if references is not None else reference_pair(subject, values)
    collectives = dict(case.collectives)
    baseline = compare(subject, values, outcome.observations, reference, oracle, collectives)
    failed = {_key(c) for c in baseline if not c.passed}
    # A known divergence's own failures are expected unperturbed: they are left out of "caught" like
    # any baseline failure, and the rest of the case's checks measure as in a parity case.
    explained = [c for c in baseline if not c.passed and case.divergence is not None and case.divergence.covers(c.name)]
    unexplained = [c for c in baseline if not c.passed and c not in explained]
    ratios = [c.ratio for c in baseline if c.ratio is not None and c.bound and c.passed]
    entry = {"id": case.id, "subject": case.subject, "dtype": values.optional("dtype", None),
             "baseline_failed": sorted(c.name for c in unexplained),
             "divergence_failed": sorted({c.name for c in explained}),
             "baseline_worst_ratio": max(ratios) if ratios else None, "thresholds": {}}
    if unexplained:
        return entry
    rank = max(outcome.observations)
    claims = subject.claims(values)

    def judge(observable, mode, eps):
        perturbed = perturb.perturb(outcome.observations, rank, observable, mode, eps, claims, values.optional("tp", 1))
        return compare(subject, values, perturbed, reference, oracle, collectives)

    for observable in perturb.OBSERVABLES:
        if not perturb.available(outcome.observations, rank, observable):
            continue
        for mode in perturb.MODES:
            eps, by = threshold(judge, observable, mode, failed)
            entry["thresholds"][f"{observable}/{mode}"] = {"eps": eps, "caught_by": by}
    return entry


def aggregate(entries: list[dict]) -> dict:
    """(observable/mode, dtype) -> the worst (largest) threshold over the measured cases, and where."""
    worst: dict = {}
    for e in entries:
        for key, t in e["thresholds"].items():
            cell = worst.setdefault(key, {}).setdefault(e["dtype"], {"eps": 0.0, "case": None, "cases": 0})
            cell["cases"] += 1
            eps = math.inf if t["eps"] is None else t["eps"]
            if eps > cell["eps"]:
                cell.update(eps=eps, case=e["id"], caught_by=t["caught_by"])
    return worst


def _fmt(eps) -> str:
    return "not caught" if eps == math.inf else f"{eps:.2g}"


def markdown(worst: dict, entries: list[dict], command: str) -> str:
    dtypes = sorted({d for cells in worst.values() for d in cells}, key=lambda d: ("fp32", "bf16", "fp16").index(d))
    lines = [f"Smallest planted relative error caught (worst case over the measured cases); `{command}`.", "",
             "| observable / mode | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
    for key in sorted(worst, key=lambda k: (perturb.MODES.index(k.split("/")[1]), list(perturb.OBSERVABLES).index(
            k.split("/")[0]))):
        cells = []
        for d in dtypes:
            cell = worst[key].get(d)
            if cell is None:
                cells.append("-")
                continue
            target = SENSITIVITY_TARGETS.get(d) if key.endswith("/scale") else None
            mark = "" if target is None else (" ok" if cell["eps"] <= target else f" **> {target:g}**")
            cells.append(f"{_fmt(cell['eps'])}{mark} ({cell['cases']})")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    ratios: dict = {}
    for e in entries:
        if e["baseline_worst_ratio"] is not None:
            ratios[e["dtype"]] = max(ratios.get(e["dtype"], 0.0), e["baseline_worst_ratio"])
    red = [e["id"] for e in entries if e["baseline_failed"]]
    lines += ["", "Targets for the scale mode: " + ", ".join(f"{d} <= {t:g}" for d, t in SENSITIVITY_TARGETS.items()),
              "(count of cases per cell in parentheses).", "",
              "Unperturbed worst measured/bound ratio per dtype: "
              + ", ".join(f"{d} {r:.3f}" for d, r in sorted(ratios.items())),
              f"Cases whose unperturbed checks failed (false alarms, measured nothing): {len(red)}"
              + (": " + ", ".join(red) if red else "")]
    return "\n".join(lines) + "\n"


def cmd_sensitivity(args) -> int:
    selected = select(load(args.matrix), args.k, args.case, None)
    cases = [c for c in selected if not c.expect.is_error]
    if not cases:  # a selection error: the CLI prints it in one line, exit status 2
        raise SelectionError("no parity cases selected (rejection cases measure no bound)")
    runner = Runner(timeout_s=args.timeout)
    entries = []
    skipped = [{"id": c.id, "reason": "a rejection case: it measures no bound"} for c in selected if c.expect.is_error]
    for entry in skipped:
        print(f"skip {entry['id']}: {entry['reason']}", flush=True)
    start = time.monotonic()
    try:
        for case in cases:
            reason = SUBJECTS[case.subject].unavailable_reason(case.values)
            if reason:
                skipped.append({"id": case.id, "reason": reason})
                print(f"skip {case.id}: {reason}", flush=True)
                continue
            outcome = runner.pool(case.world_size, case.values.optional("device", "cpu")).run(
                case.subject, case.values, args.timeout)
            if outcome.errors:
                first = min(outcome.errors)
                skipped.append({"id": case.id, "reason": f"rank {first} raised {outcome.errors[first].type}"})
                print(f"error {case.id}: rank {first} raised {outcome.errors[first].type}", flush=True)
                continue
            entry = measure_case(case, outcome, runner.references)
            entries.append(entry)
            scale = {k.split("/")[0]: _fmt(math.inf if v["eps"] is None else v["eps"])
                     for k, v in entry["thresholds"].items() if k.endswith("/scale")}
            print(f"{case.id}: worst ratio {entry['baseline_worst_ratio'] or 0:.3f}; scale caught at {scale}"
                  + (f"; BASELINE FAILED {entry['baseline_failed'][:3]}" if entry["baseline_failed"] else ""),
                  flush=True)
    finally:
        runner.close()
    out = Path(args.report)
    print(write_report(out, entries, skipped, "parity " + " ".join(args.argv), time.monotonic() - start))
    print(f"wrote {out}/sensitivity.json, sensitivity.md")
    return 1 if any(e["baseline_failed"] for e in entries) else 0


def write_report(out: Path, entries: list[dict], skipped: list[dict], command: str, seconds: float) -> str:
    """DIR/sensitivity.json and sensitivity.md of measured cases (also of several runs' merged: their
    entries are per case, so the worst per cell is the same whichever run measured it). Returns the table."""
    worst = aggregate(entries)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sensitivity.json").write_text(json.dumps(
        {"command": command, "seconds": round(seconds, 1), "targets": SENSITIVITY_TARGETS,
         "worst": {k: {d: {**c, "eps": None if c["eps"] == math.inf else c["eps"]} for d, c in v.items()}
                   for k, v in worst.items()},
         "cases": entries, "skipped": skipped}, indent=1))
    table = markdown(worst, entries, command)
    if skipped:  # every selected case is accounted for: measured, or not measured and why
        table += "\nNot measured:\n" + "".join(f"- {e['id']}: {e['reason']}\n" for e in skipped)
    (out / "sensitivity.md").write_text(table)
    return table
