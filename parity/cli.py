"""parity list | run | check | explore | diff | findings | mutants | bench | scale | sensitivity: the command-line face of
the suite.

Exit status: 0 all selected cases passed (or were skipped/diverged as allowed); 1 a case failed
(or a diff got worse, a mutant survived, explore found a failure); 2 bad input, named in one line on
stderr; 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


class UsageError(Exception):
    """Input the user can fix: printed as one line, exit status 2."""


def cmd_list(args) -> int:
    from parity.matrix.cases import load, select

    if args.quick_update:
        from parity.matrix.quick import QUICK_FILE, update

        text = update()
        print(f"wrote {QUICK_FILE}: {text.splitlines()[1].lstrip('# ')}")
        return 0
    cases = quick_narrowed(args, select(load(args.matrix), args.k, args.case, args.device, args.framework))
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


def quick_narrowed(args, cases) -> list:
    """--quick: only the cases of the committed quick selection (cases/quick.txt, parity/matrix/quick.py)."""
    if not args.quick:
        return cases
    from parity.matrix.quick import QuickError, only_quick

    try:
        return only_quick(cases)
    except QuickError as exc:
        raise UsageError(f"--quick: {exc}") from None


def rerun_ids(directory: str, strict: bool) -> list[str]:
    """The cases a previous report failed; under strict, also its xpassed ones (they fail now)."""
    path = Path(directory) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--rerun-failed {directory}: cannot read {path}: {exc.strerror or exc} "
                         "(want a directory written by `parity run --report`)") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--rerun-failed {directory}: {path} is not JSON: {exc}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("cases"), list):
        raise UsageError(f"--rerun-failed {directory}: {path} has no 'cases' list (not a parity report?)")
    wanted = {"failed", "xpassed"} if strict else {"failed"}
    return [c["id"] for c in summary["cases"] if isinstance(c, dict) and c.get("verdict") in wanted]


def resolve_rerun(args, strict: bool) -> bool:
    """--rerun-failed DIR becomes --case for each failure (so both launchers honour it); False: nothing to rerun."""
    from parity.matrix.cases import SelectionError, load, select

    if args.case:
        raise UsageError("--rerun-failed and --case both pick the cases: give one of them")
    ids = rerun_ids(args.rerun_failed, strict)
    if not ids:
        return False
    try:
        select(load(args.matrix), None, ids, args.device, args.framework)
    except SelectionError as exc:
        raise UsageError(f"--rerun-failed {args.rerun_failed}: {exc}; pass the --matrix that run used") from None
    args.case = ids
    return True


def use_reference_cache(args) -> Path | None:
    """--reference-cache DIR, checked and made: where the reference cache keeps its copy on disk
    (parity/checks/reference_disk.py); None without the option."""
    if args.reference_cache is None:
        return None
    if args.no_reference_cache:
        raise UsageError("--reference-cache and --no-reference-cache: give one of them (--no-reference-cache is "
                         "the harness with no cache at all)")
    path = Path(args.reference_cache)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--reference-cache {args.reference_cache}: exists and is not a directory "
                         "(allowed: a directory, created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--reference-cache {args.reference_cache}: cannot create it: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--reference-cache {args.reference_cache}: not writable by this user")
    return path


def cmd_run(args) -> int:
    from parity.matrix.cases import at_seeds, load, seed_list, select
    from parity.mutation.catalog import ENV_VAR as MUTANT_VAR, BY_NAME, apply_named
    from parity.settings import RunSettings

    # The run's settings, built once here (the PARITY_* variables, the options on top) and handed
    # to the runner, its jobs and their ranks.
    settings = RunSettings.from_env(timeout_s=args.timeout, jobs=args.jobs, log_dir=args.logs,
                                    **({"strict": True} if args.strict else {}))
    if settings.mutant and settings.mutant not in BY_NAME:
        raise UsageError(f"{MUTANT_VAR}={settings.mutant}: no such mutant (see `parity mutants --list`)")
    if args.rerun_failed and not resolve_rerun(args, settings.strict):
        print(f"parity: {args.rerun_failed}/summary.json lists no failed case: nothing to rerun")
        return 0
    disk = use_reference_cache(args)
    if disk is not None:
        settings = settings.replace(reference_disk=str(disk))
    if args.launcher == "torchrun":
        if args.passes > 1 or args.profile:
            raise UsageError("--passes and --profile work with --launcher spawn only (torchrun starts the ranks, "
                             "so this process cannot time or measure them)")
        if args.maxfail:
            raise UsageError("-x/--maxfail works with --launcher spawn only (a torchrun job cannot stop its peers early)")
        from parity.torchrun_launch import cmd_run_torchrun

        return cmd_run_torchrun(args, settings)
    cases = quick_narrowed(args, select(load(args.matrix), args.k, args.case, args.device, args.framework))
    if not cases:
        raise UsageError("no cases selected")
    seeds = seed_list(args.seed, args.seeds)
    if seeds is not None:
        cases = at_seeds(cases, seeds)
    # A reference mutant lives in this process (the ranks apply rank mutants themselves), so a
    # mutation check's reproducer `PARITY_MUTANT=... parity run --case ID` plants it here too.
    apply_named(settings.mutant, "parent")
    return run_cases(args, cases, settings)


def run_cases(args, cases, settings) -> int:
    from parity.checks.verdict import FAILED
    from parity.harness.job_processes import job_runner
    from parity.harness.runner import default_jobs
    from parity.report.console import Progress, summary_table, write_report

    harness = {}
    if getattr(args, "baseline", False):
        from parity.harness.runner import BASELINE_SETTINGS

        if args.jobs > 1 or args.reference_cache:
            raise UsageError("--baseline is one job with no reference cache: drop -j/--reference-cache")
        args.jobs, args.no_reference_cache, harness = 1, True, dict(BASELINE_SETTINGS)
    jobs = args.jobs or default_jobs(cases)
    # --no-reference-cache: the harness as it was before the cache (the benchmark's baseline).
    settings = settings.replace(jobs=jobs, **({"reference_cache_size": 0} if args.no_reference_cache else {}))
    gathered = None
    if args.report:
        # What the report records about the packages, the machine and its capabilities takes git
        # and probe child processes of seconds (the Triton probe's answer is also cached for the
        # cases): gathered while the cases run, as the run starts, not after them.
        from concurrent.futures import ThreadPoolExecutor

        from parity.report.console import gather_environment

        gatherer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-environment")
        gathered = gatherer.submit(gather_environment)
        gatherer.shutdown(wait=False)
    harness.setdefault("overlap_reference", not args.no_reference_cache)
    runner = job_runner(jobs, settings, **harness)
    print(f"running {len(cases)} cases" + (f", {jobs} at once" if jobs > 1 else "")
          + (f", {args.passes} passes" if args.passes > 1 else "")
          + (" (strict: skips fail)" if settings.strict else ""), flush=True)
    any_failed, interrupted = False, False
    stream = None
    if args.report:
        from parity.report.stream import ReportStream

        stream = ReportStream()  # each case's share of the report, made while the next cases run
    try:
        for number in range(1, args.passes + 1):
            start = time.monotonic()
            if stream:
                stream.reset()
            # The last pass's verdicts (about 150 KB a case) go before this pass makes its own: held
            # through it, they were a second pass's worth in the parent (--passes: +40% at pass 2).
            verdicts = not_run = None
            verdicts, not_run, interrupted = run_pass(args, runner, cases, Progress(len(cases)), stream)
            wall = time.monotonic() - start
            any_failed |= any(v.status == FAILED for v in verdicts)
            if args.passes > 1 and not interrupted:
                from parity.report.memory import rss_line

                print(rss_line(number, wall, runner.rank_pids()), flush=True)
            if interrupted or not_run:  # Ctrl-C, or --maxfail stopped this pass: no other pass
                break
    except BaseException:
        # A second Ctrl-C while the first one's partial results were gathered (or any error): the
        # ranks and jobs are killed now, not waited for while they finish their batches.
        runner.close(force=True)
        if stream:
            stream.close()
        raise
    cache_stats = runner.reference_cache_stats()  # its jobs' counts go with them
    occupied = runner.occupancy()
    # Stopped by --maxfail, the ranks and jobs may be mid-case: killed, not waited for (-x returns at once).
    runner.close(force=interrupted or bool(not_run))
    # The summary, report and profile are the last pass's (each pass runs the same cases).
    print(summary_table(verdicts, wall, not_run))
    report_timing = {} if args.profile else None
    if args.report:
        from parity.harness.timing import phase

        with phase(report_timing, "verdict dicts"):  # what the stream has not made yet
            records, texts = stream.parts(len(verdicts))
        stream.close()
        write_report(args.report, records, wall, ["parity", *args.argv], not_run=not_run,
                     interrupted=interrupted, timing=report_timing, gathered=gathered.result(), results_texts=texts)
        print(f"wrote {args.report}/: summary.json, results.jsonl, summary.md, report.html"
              + (" (partial: interrupted)" if interrupted else ""))
    if args.profile:
        from parity.report.profile import profile, profile_markdown, write_profile

        prof = profile(verdicts, wall, jobs, report_timing, cache_stats, occupied)
        print(profile_markdown(prof))
        if args.report:
            write_profile(args.report, prof)
            print(f"wrote {args.report}/: profile.json, profile.md")
    if interrupted:
        return INTERRUPTED
    return 1 if any_failed else 0


def cmd_check(args) -> int:
    """One architecture under the user's DeepSpeed config: translated into one case (parity/matrix/user_config.py),
    run as `parity run` runs a case, its verdict printed and its report written (to a fresh temp dir without
    --report)."""
    import dataclasses
    import tempfile

    from parity.matrix import user_config
    from parity.matrix.user_config import UserConfigError, read_config, resolve_arch, translate
    from parity.settings import RunSettings

    tp = None
    if args.tp is not None:
        try:
            tp = int(args.tp)
        except ValueError:
            tp = None
        if tp is None or tp < 1:
            raise UsageError(f"--tp {args.tp}: want a positive integer")
    try:
        config = read_config(args.ds_config)
        arch, user, notes = resolve_arch(args.arch)
        translated = translate(config, args.ds_config, arch, tp=tp, dtype=args.dtype, user=user)
    except UserConfigError as exc:
        raise UsageError(str(exc)) from None
    case = translated.case
    for line in notes + translated.notes:
        print(f"note: {line}")
    print(f"case: {case.id} ({', '.join(f'{a}={v!r}' for a, v in case.values.items())})", flush=True)
    args.report = args.report or tempfile.mkdtemp(prefix="parity-check-")
    if case.source.startswith("--ds-config"):
        # Not a case of the case files: written as a one-entry case file beside the report, so the reproducer a
        # failure prints (`parity run --matrix FILE --case ID`) runs this very case.
        Path(args.report).mkdir(parents=True, exist_ok=True)
        entry = Path(args.report) / "check.toml"
        entry.write_text(user_config.case_toml(case, f"parity check --arch {args.arch} --ds-config {args.ds_config}"))
        case = dataclasses.replace(case, source=f"{entry}:matrix[0]")
        print(f"case file: {entry}")
        # Judged, where it fails, against the case files' marks whose scope admits it (as parity explore judges).
        from parity.explore.known import Marks

        admitted = []
        for mark in Marks().candidates(case):  # one mark named by several entries is tried once
            if all(mark.divergence != m.divergence for m in admitted):
                admitted.append(mark)
        if admitted:
            case = dataclasses.replace(case, admitted=tuple((m.source, m.divergence) for m in admitted))
            print(f"marks that admit it (a failure they explain reads diverged): "
                  f"{', '.join(m.divergence.name for m in admitted)}")
    for name, value in (("jobs", 1), ("baseline", False), ("no_reference_cache", False), ("reference_cache", None),
                        ("passes", 1), ("profile", False), ("maxfail", None)):
        setattr(args, name, value)
    settings = RunSettings.from_env(timeout_s=args.timeout, jobs=1, **({"strict": True} if args.strict else {}))
    status = run_cases(args, [case], settings)
    summary = json.loads((Path(args.report) / "summary.json").read_text())
    verdict = next((c for c in summary.get("cases", []) if c.get("id") == case.id), {})
    print(f"verdict: {verdict.get('verdict', 'not run')}: {case.id}; report: {args.report}/summary.md")
    return status


def run_pass(args, runner, cases, progress, stream=None) -> tuple[list, list, bool]:
    """Every selected case once: (verdicts, cases not run with why, interrupted by Ctrl-C); each
    verdict also goes to the report's stream, where there is one."""
    from parity.checks.verdict import FAILED

    verdicts, not_run = [], []
    try:
        # With --maxfail the runner stops itself at the decision (job processes count failures as they
        # arrive, not in case order) and yields what it already has: those may skip cases.
        for verdict in runner.run_all(cases, maxfail=args.maxfail):
            verdicts.append(verdict)
            if stream:
                stream.add(verdict)
            progress.update(verdict)
        failures = sum(v.status == FAILED for v in verdicts)
        if args.maxfail and failures >= args.maxfail and len(verdicts) < len(cases):
            why = f"not run: stopped after {failures} failed (--maxfail {args.maxfail})"
            ran = {id(v.case) for v in verdicts}
            not_run = [{"id": c.id, "reason": why} for c in cases if id(c) not in ran]
    except KeyboardInterrupt:
        ran = {id(v.case) for v in verdicts}
        not_run = [{"id": c.id, "reason": "not run: interrupted (Ctrl-C)"} for c in cases if id(c) not in ran]
        print(f"\ninterrupted: {len(verdicts)} of {len(cases)} cases ran", flush=True)
        return verdicts, not_run, True
    return verdicts, not_run, False


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"want an integer >= 1, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"want an integer >= 0, got {text!r}")
    return int(text)


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("tp-parity")
    except PackageNotFoundError:
        return "unknown (tp-parity is not installed; running from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and option has help text (tests/test_cli.py walks this tree)."""
    from parity.bench import add_arguments as add_bench_arguments
    import parity.mutants as mutation_check
    from parity.report.diff import add_arguments as add_diff_arguments

    parser = argparse.ArgumentParser(prog="parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the installed tp-parity version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {"list": "print the selected case ids (or their definitions, or the coverage table)",
             "run": "run the selected cases on rank processes and judge them against the reference"}
    for name in ("list", "run"):
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        p.add_argument("--matrix", action="append", help="case file (repeatable; default: cases/*.toml)")
        p.add_argument("-k", metavar="EXPR", help="select cases by id, pytest -k syntax")
        p.add_argument("--case", action="append", metavar="ID", help="run exactly this case (repeatable)")
        p.add_argument("--device", choices=("cpu", "cuda"), help="only cases on this device")
        p.add_argument("--framework", metavar="NAME",
                       help="only cases of this framework's subjects (deepspeed, liger, torch, megatron)")
        p.add_argument("--quick", action="store_true",
                       help="only the quick selection (cases/quick.txt: every mutant's cheapest killer, every "
                            "subject, axis value and finding, axis-value pairs within a time budget)")
    sub.choices["list"].add_argument("--json", action="store_true", help="print each case's definition as JSON")
    sub.choices["list"].add_argument("--coverage", action="store_true",
                                     help="print the subject x axis coverage table (markdown, as in docs/subjects.md)")
    sub.choices["list"].add_argument("--quick-update", action="store_true",
                                     help="recompute the quick selection from the case files, the findings and "
                                          "results/mutation/kill_matrix.json into cases/quick.txt")
    run = sub.choices["run"]
    run.add_argument("--report", metavar="DIR", help="write DIR/summary.json, results.jsonl, summary.md, report.html")
    run.add_argument("--strict", action="store_true", help="a skip is a failure (also PARITY_STRICT=1)")
    run.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take on its ranks")
    run.add_argument("-j", "--jobs", type=int, default=0, metavar="N",
                     help="job processes running cases at once, each with its own rank groups (default: cores // "
                          "the smallest selected world size, at most one per 6 GiB available; busy ranks never "
                          "outnumber the cores; results are the same for every N)")
    run.add_argument("--no-reference-cache", action="store_true",
                     help="compute every case's reference afresh, after its ranks are done, as the harness did "
                          "before references were shared and overlapped with rank work (part of --baseline; "
                          "results are the same)")
    run.add_argument("--baseline", action="store_true",
                     help="the harness as issue 16 found it, for benchmarks: one case at a time, judged after its "
                          "ranks, references computed afresh, spawned ranks, a peer stuck after a failure waited out "
                          "for the whole grace (implies -j 1 --no-reference-cache; results are the same)")
    run.add_argument("--reference-cache", metavar="DIR",
                     help="also keep every computed reference in DIR, keyed by a hash of what it depends on "
                          "(its model, training and dtype, the references/ source, torch): later runs, parallel "
                          "jobs and pytest workers read it instead of computing it again; results are the same")
    run.add_argument("--profile", action="store_true",
                     help="print where the time went (rank start, IPC, rank work, waiting, reference, comparison, "
                          "report writing); with --report also DIR/profile.json and DIR/profile.md")
    run.add_argument("--passes", type=positive_int, default=1, metavar="N",
                     help="run the selection N times in this process and print the parent's and every rank's "
                          "RSS after each pass (a memory soak); the report is the last pass's")
    run.add_argument("--logs", metavar="DIR", help="where rank logs go (default: a temp dir)")
    run.add_argument("--launcher", choices=("spawn", "torchrun"), default="spawn",
                     help="spawn: parity starts its own rank groups (default); torchrun: this process is one "
                          "rank of `torchrun ... -m parity.cli run --launcher torchrun` (parity/torchrun_launch.py)")
    run.add_argument("-x", "--exitfirst", action="store_const", const=1, dest="maxfail",
                     help="stop after the first failed case (the rest are listed as not run)")
    run.add_argument("--maxfail", type=positive_int, metavar="N", help="stop after N failed cases")
    run.add_argument("--seed", type=nonnegative_int, metavar="N",
                     help="run the selection at seed N (initial weights and data; 0 is the default seed)")
    run.add_argument("--seeds", type=positive_int, metavar="K",
                     help="run the selection at seeds 0..K-1, all cases at one seed before the next")
    run.add_argument("--rerun-failed", metavar="DIR",
                     help="run the cases that failed in the report DIR/summary.json (and, under --strict, "
                          "those that xpassed); -k and --device narrow them further")
    check_help = ("one architecture under your DeepSpeed config: translated into one case (its tensor_parallel, "
                  "zero, precision, clipping and accumulation keys; any other key refused by name), run with every "
                  "check, verdict and report printed")
    check = sub.add_parser("check", help=check_help, description=check_help)
    check.add_argument("--arch", required=True, metavar="NAME_OR_CONFIG_JSON",
                       help="a causal-LM model_type of transformers (llama, qwen2, ...) or a config.json of one")
    check.add_argument("--ds-config", required=True, metavar="FILE", help="your DeepSpeed config (JSON)")
    check.add_argument("--tp", metavar="N", help="tensor-parallel size (default: the config's, else 2)")
    check.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="model dtype (default: the config's "
                       "bf16/fp16 section, else fp32)")
    check.add_argument("--report", metavar="DIR", help="where the report goes (default: a fresh temp dir)")
    check.add_argument("--strict", action="store_true", help="a skip is a failure (also PARITY_STRICT=1)")
    check.add_argument("--timeout", type=float, default=300.0, help="seconds the case may take on its ranks")
    from parity.explore.cli import add_arguments as add_explore_arguments

    add_explore_arguments(sub.add_parser("explore", help="property-based search (hypothesis) for failing cases "
                                         "beyond the case files, within a wall-time budget",
                                         description="property-based search (hypothesis) for failing cases beyond "
                                         "the case files; a failure is shrunk and printed as a ready case-file entry"))
    add_diff_arguments(sub.add_parser("diff", help="compare two report directories; exits 1 if a verdict got worse",
                                      description="compare two report directories; exits 1 if a verdict got worse"))
    from parity.report.findings import add_arguments as add_findings_arguments

    findings_help = "print the root causes (findings/*.toml) with their reproducers, marks and cases"
    add_findings_arguments(sub.add_parser("findings", help=findings_help, description=findings_help))
    mutants = sub.add_parser("mutants", help="mutation check: planted bugs the suite must catch",
                             description=mutation_check.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mutation_check.add_arguments(mutants)
    from parity.sensitivity import __doc__ as sensitivity_doc, add_arguments as add_sensitivity_arguments

    add_sensitivity_arguments(sub.add_parser(
        "sensitivity", help="measure the smallest planted error each check kind catches (writes DIR/sensitivity.*)",
        description=sensitivity_doc, formatter_class=argparse.RawDescriptionHelpFormatter))
    add_bench_arguments(sub.add_parser("bench", help="print CE backend figures (time, peak memory); not a test",
                                       description="print CE backend figures (time, peak memory); not a test"))
    from parity.scale.run import add_arguments as add_scale_arguments

    scale_help = "run the production-shape cases (cases/scale/) with stage-local float64 checks on the ranks"
    add_scale_arguments(sub.add_parser("scale", help=scale_help, description=scale_help))
    return parser


def dispatch(args) -> int:
    if args.command == "diff":
        from parity.report.diff import cmd_diff

        return cmd_diff(args)
    if args.command == "findings":
        from parity.report.findings import cmd_findings

        return cmd_findings(args)
    if args.command == "bench":
        from parity.bench import cmd_bench

        return cmd_bench(args)
    if args.command == "scale":
        from parity.scale.run import cmd_scale

        return cmd_scale(args)
    if args.command == "sensitivity":
        from parity.sensitivity import cmd_sensitivity

        return cmd_sensitivity(args)
    if args.command == "explore":
        from parity.explore.cli import cmd_explore

        return cmd_explore(args)
    if args.command == "mutants":
        from parity.mutants import run

        return run(args)
    return {"list": cmd_list, "run": cmd_run, "check": cmd_check}[args.command](args)


def main(argv=None) -> int:
    if argv is None:  # the command line: run it again with str hashes pinned (parity/hash_seed.py says why)
        from parity.hash_seed import restart_pinned

        restart_pinned()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        # The case code imports the subject registry, which imports PARITY_SUBJECT_MODULES.
        from parity.matrix.cases import CaseFileError, SelectionError
    except ImportError as exc:
        if not getattr(exc, "usage_error", False):  # a broken install keeps its traceback
            raise
        print(f"parity: {exc}", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv  # for the report: the command as typed
        status = dispatch(args)
        sys.stdout.flush()  # here, so a closed pipe is met inside the try and not at interpreter exit
        return status
    except BrokenPipeError:
        # `parity list | head`: the reader had what it wanted. Later writes (and the flush at exit)
        # go nowhere instead of raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CaseFileError as exc:
        print(f"parity: bad case file: {exc}", file=sys.stderr)
        return 2
    except (UsageError, SelectionError) as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
