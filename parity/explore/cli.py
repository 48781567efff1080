"""`parity explore`: its options and what it prints. Imports the search (and hypothesis) only when run,
so building the CLI's parser stays cheap."""
from __future__ import annotations

import json
import os
import sys
import tempfile

DEFAULT_BUDGET_S = 600.0
DEFAULT_SEED = 0
DEFAULT_MAX_WORLD = 4
# The strategy families (parity/explore/families.py FAMILIES), named here so building the parser imports nothing.
STRATEGIES = ("axes", "configs", "calls", "structures", "topologies")


def add_arguments(p) -> None:
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                   help=f"wall time to spend generating cases (default {DEFAULT_BUDGET_S:g}); shrinking a failure "
                        "stops with it too, and the run ends after the case in flight")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"hypothesis seed: the same seed draws the same cases in the same order (default {DEFAULT_SEED})")
    p.add_argument("--max-examples", type=int, metavar="N",
                   help="stop after N cases run, whatever the budget left (reproducible by count, not by time)")
    p.add_argument("--strategy", default="axes", choices=STRATEGIES, metavar="NAME",
                   help="what the points are drawn as: axes (every subject's axes, the default), configs (a DeepSpeed "
                        "config from its schema), calls (an entry point's arguments from its signature), structures "
                        "(head names, nesting, ties, specs) or topologies (a world larger than tp); docs/explore.md")
    p.add_argument("--subject", action="append", metavar="NAME",
                   help="search only this subject (repeatable; default: the strategy's subjects, for axes every "
                        "subject but ds_reject)")
    p.add_argument("--max-world", type=int, metavar="N",
                   help=f"largest rank group (tp x dp) to draw (default {DEFAULT_MAX_WORLD}, 8 for --strategy "
                        "topologies; tp is drawn from 2..8 within it)")
    p.add_argument("--report", metavar="DIR",
                   help="write DIR/explore.json, the suite's report of every explored case, and the shrunk failure "
                        "as DIR/explore-failure.toml (default for the failure file: a temp dir)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take on its ranks")
    p.add_argument("--logs", metavar="DIR", help="where rank logs go (default: a temp dir)")


def _line(verdict, n: int) -> str:
    text = f"[{n}] {verdict.status.upper():8} {verdict.case.id}"
    if verdict.status != "passed":
        text += f"\n    {verdict.first_failure.splitlines()[0] if verdict.first_failure else ''}"
    return text


def cmd_explore(args) -> int:
    # SelectionError: the CLI prints it as one line and exits 2 (parity.cli cannot be imported from here:
    # it imports this module).
    from parity.matrix.cases import SelectionError as UsageError
    from parity.explore.domains import NOT_EXPLORED, explorable_subjects
    from parity.mutation.catalog import BY_NAME, ENV_VAR as MUTANT_VAR, apply_named
    from parity.settings import RunSettings
    from parity.subjects import SUBJECTS

    from parity.explore.families import FAMILIES

    family = FAMILIES[args.strategy]
    reachable = list(family.subjects or explorable_subjects())
    subjects = args.subject or reachable
    for name in subjects:
        if name not in SUBJECTS:
            raise UsageError(f"--subject {name}: no such subject (known: {', '.join(explorable_subjects())})")
        if name in NOT_EXPLORED:
            raise UsageError(f"--subject {name}: not explored: {NOT_EXPLORED[name]}")
        if name not in reachable:
            raise UsageError(f"--subject {name}: --strategy {args.strategy} does not draw it (it draws: "
                             f"{', '.join(reachable)})")
    if args.max_world is None:
        args.max_world = family.max_world
    if args.max_world < 2:
        raise UsageError(f"--max-world {args.max_world}: want at least 2 (tp is drawn from 2..8)")
    if args.budget <= 0 or (args.max_examples is not None and args.max_examples < 1):
        raise UsageError("--budget and --max-examples want positive values")
    settings = RunSettings.from_env()
    mutant = settings.mutant
    if mutant and mutant not in BY_NAME:
        raise UsageError(f"{MUTANT_VAR}={mutant}: no such mutant (see `parity mutants --list`)")
    apply_named(mutant, "parent")  # a reference mutant lives where the references run, as in `parity run`

    from parity.explore.search import explore, write_failure

    print(f"exploring {len(subjects)} subjects as {args.strategy} for {args.budget:g} s (seed {args.seed}, world <= "
          f"{args.max_world}"
          + (f", at most {args.max_examples} cases" if args.max_examples else "") + ")", flush=True)
    shown = []

    def on_verdict(v):
        shown.append(v)
        print(_line(v, len(shown)), flush=True)

    result = explore(subjects, args.budget, args.seed, args.max_world, args.max_examples, args.timeout, args.logs,
                     on_verdict, run=settings, strategy=args.strategy)
    counts = result.counts
    print(f"\nexplored {len(result.verdicts)} cases in {result.seconds:.0f} s, stopped by {result.stopped_by}: "
          + ", ".join(f"{counts[s]} {s}" for s in ("passed", "diverged", "xpassed", "skipped", "failed") if counts[s]))
    for reason, n in result.not_generated.most_common():
        print(f"  not generated ({n} points drawn): {reason}")
    diverged = [v for v in result.verdicts if v.status == "diverged"]
    for v in diverged:
        print(f"  known divergence: {v.case.id}: {v.reason.splitlines()[0][:300]}")
    if result.unconfirmed:
        from parity.explore.search import CONFIRM_SEEDS, write_unconfirmed

        path = write_unconfirmed(result, args.report or tempfile.mkdtemp(prefix="parity-explore-"))
        print(f"\nrounding-bound misses that did not reproduce at most of {CONFIRM_SEEDS} other seeds (a bound's "
              f"false-alarm tail, not a finding; failed verdicts in the report, each with its seeds' verdicts; "
              f"their entries in {path}):")
        for u in result.unconfirmed:
            print(f"  {u.describe()}")
    status = 0
    if result.failure is not None:
        status = 1
        path, command = write_failure(result, args.report or tempfile.mkdtemp(prefix="parity-explore-"))
        print("\nFAILED, shrunk to a minimal case:\n" + result.failure.explain())
        drawn = result.inputs.get(result.failure.case.id)
        if drawn:
            print(f"\ndrawn by --strategy {args.strategy} as: {json.dumps(drawn, default=str)}")
        print(f"\na ready case-file entry (written to {path}):\n\n{path.read_text()}\nrun it alone:\n  {command}")
    if args.report:  # after write_failure: the failure's reproducer names the file written
        from parity.report.console import write_report

        write_report(args.report, [v.as_dict() for v in result.verdicts], result.seconds, ["parity", *args.argv])
        summary = {"strategy": result.strategy, "seed": result.seed, "budget_s": result.budget_s,
                   "max_world": result.max_world,
                   "subjects": result.subjects, "seconds": round(result.seconds, 1), "stopped_by": result.stopped_by,
                   "counts": dict(counts), "not_generated": dict(result.not_generated),
                   "cases": [{"id": v.case.id, "verdict": v.status, "reason": v.reason,
                              **({"drawn_as": result.inputs[v.case.id]} if v.case.id in result.inputs else {})}
                             for v in result.verdicts],
                   "unconfirmed": [{"id": u.verdict.case.id, "first_failure": u.verdict.first_failure,
                                    "seeds": u.seeds, "failed_seeds": u.failed_seeds} for u in result.unconfirmed],
                   "failure": None if result.failure is None else {
                       "id": result.failure.case.id, "axes": dict(result.failure.case.values),
                       "drawn_as": result.inputs.get(result.failure.case.id),
                       "first_failure": result.failure.first_failure}}
        with open(os.path.join(args.report, "explore.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
        print(f"wrote {args.report}/: explore.json, summary.json, results.jsonl, summary.md, report.html", file=sys.stderr)
    return status
