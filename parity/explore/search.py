"""The search: hypothesis draws points (domains.py), each becomes a case run by the harness's rank
groups and judged as `parity run` judges it; a failure is shrunk by hypothesis to a minimal case.

Why hypothesis's own loop, with the budget checked in the test body: a ``settings`` cannot bound
wall time, and a hand-written loop would lose hypothesis's shrinking and seeding. So:
- generation runs until the budget is spent, then the body raises ``BudgetSpent``: a BaseException,
  which hypothesis lets through at once (as it does KeyboardInterrupt) instead of shrinking it;
- once a failure was seen, hypothesis shrinks it; every case already run answers from a cache (a
  case is never run twice, and hypothesis's final replay of the minimal example sees the verdict
  it shrank to), and after the budget an unseen shrink candidate "passes" without running, so the
  shrinker stops improving and reports the smallest failure found in time;
- ``@seed`` and ``database=None`` make the sequence of drawn cases a function of the seed alone
  (which prefix of it runs depends on the budget; ``max_examples`` bounds it by count instead).

A rounding bound is a statistical test: it holds a correct subject's error against one draw of the
reference's, and at the few-source points the search favours (vocabulary 2-3 in bf16: a two-class
softmax whose every gradient entry shares a dozen tokens' errors) its false-alarm tail is measurable:
tied_row_parallel bf16, vocabulary 2, hidden 33, ZeRO 3, tp 2 failed 2 of 32 seeds, with and without
`grain = 2`, at 1.03-1.41x of a bound (`parity run --seeds 32`, 2026-12-04). A search that runs
thousands of cases meets that tail, and stopping on it says nothing about the subject. So a failure
whose every failed check is a rounding bound missed by at most CONFIRM_REACH is run again at
CONFIRM_SEEDS other seeds (other initial weights and data): a defect fails at most of them (a planted
one at all), a false alarm at few. It is a failure, shrunk as any other, where more than half of the
other seeds fail; else the search goes on and the miss is listed as not reproduced, with its seeds and
command (it stays a failed verdict in the report: nothing is relabelled). Any other failure (a crash,
a contract, an exact identity, a miss beyond the reach) stops the search at once, as before.
"""
from __future__ import annotations

import shlex
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, assume, given, seed as fixed_seed, settings

from parity.checks.verdict import DIVERGED, FAILED, Verdict
from parity.explore.domains import entry_toml, explored_case, not_a_case
from parity.explore.known import Marks
from parity.harness.rank_pool import PoolStartError
from parity.harness.runner import DEFAULT_CASE_TIMEOUT_S, Runner, judge, skip_verdict, timed_verdict
from parity.settings import RunSettings
from parity.matrix.cases import at_seed, load_file, merged_divergence

FAILURE_FILE = "explore-failure.toml"


CONFIRM_SEEDS = 8
# Bound false alarms measured 1.02-1.41x (module docstring); the bounds' own slacks are 2-4x, so a miss
# beyond twice its bound is not their tail but an error, and is not re-run.
CONFIRM_REACH = 2.0


def rounding_misses_only(verdict: Verdict) -> bool:
    """Whether every failed check that the case's mark does not cover is a rounding bound (a measured
    value held to a nonzero bound, every one of which parity/checks/tolerances.py derives from rounding:
    not an exact identity, a contract, a count or a crash) missed by at most CONFIRM_REACH."""
    known = verdict.case.divergence
    failed = [c for c in verdict.failed_checks if known is None or known.raises or not known.covers(c.name)]
    return bool(failed) and not verdict.rank_errors and all(
        c.measured is not None and c.bound and c.measured <= CONFIRM_REACH * c.bound
        for c in failed)


def explains_some(known, verdict: Verdict) -> bool:
    """Whether a numerical mark covers at least one of the verdict's failed checks: only such a mark's
    judgement, with rounding misses left over, is the one to confirm (a crash mark, or one naming
    other checks, says nothing about this outcome)."""
    return not known.raises and any(known.covers(c.name) for c in verdict.failed_checks)


@dataclass
class Unconfirmed:
    """A rounding-bound miss that did not reproduce at most other seeds."""
    verdict: Verdict
    failed_seeds: list  # the other seeds where the case failed too
    seeds: list  # the other seeds run

    def describe(self) -> str:
        return (f"{self.verdict.case.id}: {self.verdict.first_failure.splitlines()[0]}; failed at "
                f"{len(self.failed_seeds)} of {len(self.seeds)} other seeds"
                + (f" ({', '.join(map(str, self.failed_seeds))})" if self.failed_seeds else "")
                + f"\n    {self.verdict.repro()} --seeds {1 + max(self.seeds)}")


class BudgetSpent(BaseException):
    """The wall-time budget is spent and no failure is being shrunk: stop generating."""


class ExploredFailure(Exception):
    def __init__(self, verdict: Verdict):
        super().__init__(verdict.first_failure)
        self.verdict = verdict


@dataclass
class Exploration:
    seed: int
    budget_s: float
    max_world: int
    subjects: list
    verdicts: list = field(default_factory=list)  # every case run, in the order it ran
    not_generated: Counter = field(default_factory=Counter)  # reason -> distinct points drawn and not run
    failure: Verdict | None = None  # the shrunk failure
    unconfirmed: list = field(default_factory=list)  # Unconfirmed rounding-bound misses, in the order met
    stopped_by: str = ""  # "budget", "max_examples" or "failure"
    seconds: float = 0.0
    strategy: str = "axes"
    inputs: dict = field(default_factory=dict)  # case id -> the user's input the strategy drew it as (config, call)

    @property
    def counts(self) -> Counter:
        return Counter(v.status for v in self.verdicts)


def run_case(runner: Runner, case, marks: Marks) -> Verdict:
    """One explored case -> its verdict: its twin's judgement where the default matrix has the same
    case, else parity, with a failure re-judged against each mark that could explain it (known.py)."""
    twin = marks.twin(case)
    case = twin or case

    def produce():
        skipped = skip_verdict(case, strict=False)
        if skipped:
            return skipped
        key = (case.world_size, case.values.optional("device", "cpu"))
        pool = runner.pool(*key)
        try:
            outcome = pool.run(case.subject, case.values, runner.timeout_s)
        except PoolStartError as exc:
            return Verdict(case, FAILED, reason=str(exc))
        verdict = judge(case, outcome, False, pool.mode, references=runner.references)
        if verdict.status != FAILED or twin is not None:
            return verdict
        candidates = marks.candidates(case)
        beyond = None  # a mark's judgement that leaves only rounding-bound misses (confirmed over seeds)
        for mark in candidates:
            again = judge(replace(case, divergence=mark.divergence), outcome, False, pool.mode,
                          references=runner.references)
            if again.status == DIVERGED:
                again.reason += f" [mark of {mark.source}]"
                return again
            if beyond is None and explains_some(mark.divergence, again) and rounding_misses_only(again):
                beyond = again
        # A case under two documented divergences (ZeRO 0's bf16 gradient dtype and a swallowed
        # ignore_index) fails the checks of both, which no mark alone covers: the marks together,
        # united as a case file unites the marks one case falls under (cases._merged).
        numeric = [m for m in candidates if not m.divergence.raises]
        if len(numeric) > 1:
            together = merged_divergence([m.divergence for m in numeric])
            again = judge(replace(case, divergence=together), outcome, False, pool.mode,
                          references=runner.references)
            if again.status == DIVERGED:
                again.reason += f" [marks of {', '.join(m.source for m in numeric)}]"
                return again
            if beyond is None and explains_some(together, again) and rounding_misses_only(again):
                beyond = again
        return beyond or verdict

    return timed_verdict(case, produce, runner.settings)


def confirm(runner: Runner, case, verdict: Verdict, marks: Marks, record) -> Unconfirmed | None:
    """The case at CONFIRM_SEEDS other seeds, each verdict handed to record: None where more than half
    of them fail too (a failure), else the miss as Unconfirmed."""
    own = case.values["seed"]
    seeds = list(range(own + 1, own + 1 + CONFIRM_SEEDS))
    failed = []
    for s in seeds:
        again = run_case(runner, at_seed(verdict.case, s), marks)  # under the mark it was judged by
        record(again)
        if again.status == FAILED:
            failed.append(s)
    return None if 2 * len(failed) > len(seeds) else Unconfirmed(verdict, failed, seeds)


def explore(subjects, budget_s: float, seed: int, max_world: int, max_examples: int | None = None,
            timeout_s: float = DEFAULT_CASE_TIMEOUT_S, log_dir: str | None = None, on_verdict=None,
            marks: Marks | None = None, run: RunSettings | None = None, strategy: str = "axes") -> Exploration:
    """run: the run's settings (parity explore builds them from PARITY_*); never strict. strategy: the family of
    points drawn (families.FAMILIES)."""
    from parity.explore.families import FAMILIES

    result = Exploration(seed, budget_s, max_world, list(subjects), strategy=strategy)
    marks = marks or Marks()
    runner = Runner(run, timeout_s=timeout_s, strict=False, log_dir=log_dir)
    cache: dict = {}
    confirmed: dict = {}  # case id -> its Unconfirmed, or None where the miss reproduced
    unrun: dict = {}
    failing = False
    start = time.monotonic()

    def record(verdict):
        result.verdicts.append(verdict)
        if on_verdict:
            on_verdict(verdict)

    @settings(database=None, deadline=None, max_examples=max_examples or 10**6, verbosity=Verbosity.quiet,
              phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
              report_multiple_bugs=False, print_blob=False)
    @fixed_seed(seed)
    @given(FAMILIES[strategy].points(list(subjects), max_world))
    def probe(point):
        nonlocal failing
        name, values, drawn = point
        reason = not_a_case(name, values, max_world)
        if reason:
            unrun.setdefault(reason, set()).add((name, tuple(values.items())))
            assume(False)
        case = explored_case(name, values)
        if drawn:
            result.inputs.setdefault(case.id, drawn)
        verdict = cache.get(case.id)
        if verdict is None:
            if time.monotonic() - start >= budget_s:
                if failing:
                    return  # shrinking past the budget: an unseen candidate is not run
                raise BudgetSpent
            verdict = cache[case.id] = run_case(runner, case, marks)
            record(verdict)
        if verdict.status == FAILED:
            if rounding_misses_only(verdict):
                if case.id not in confirmed:
                    confirmed[case.id] = confirm(runner, case, verdict, marks, record)
                if confirmed[case.id] is not None:
                    if confirmed[case.id] not in result.unconfirmed:
                        result.unconfirmed.append(confirmed[case.id])
                    return
            failing = True
            raise ExploredFailure(verdict)

    try:
        probe()
        result.stopped_by = "max_examples"
    except BudgetSpent:
        result.stopped_by = "budget"
    except ExploredFailure as exc:
        result.stopped_by, result.failure = "failure", exc.verdict
    finally:
        runner.close()
        result.seconds = time.monotonic() - start
        result.not_generated = Counter({r: len(p) for r, p in unrun.items()})
    return result


def write_failure(result: Exploration, directory) -> tuple[Path, str]:
    """The shrunk failure as a one-entry case file under directory, and the command that runs it.
    The file is read back: it must make exactly the case that failed."""
    case = result.failure.case
    path = Path(directory) / FAILURE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    how = "" if result.strategy == "axes" else f" --strategy {result.strategy}"
    text = entry_toml(case.subject, case.values, f"found by parity explore{how} --seed {result.seed} (shrunk)")
    path.write_text(text)
    (again,) = load_file(path)
    if again.id != case.id or again.values != case.values:
        raise RuntimeError(f"{path} makes {again.id}, not the failing {case.id}")
    # From here on the failure's reproducer (Verdict.repro, the report) names the file just written.
    result.failure.case = replace(case, source=f"{path}:matrix[0]")
    env = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(result.failure.env.items()))
    return path, f"{env}parity run --matrix {shlex.quote(str(path))} --case {case.id}"


UNCONFIRMED_FILE = "explore-unconfirmed.toml"


def write_unconfirmed(result: Exploration, directory) -> Path:
    """The unconfirmed misses as case entries, one per case, under directory; each verdict's reproducer then
    names that file (read back: every entry must make its case)."""
    path = Path(directory) / UNCONFIRMED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(entry_toml(u.verdict.case.subject, u.verdict.case.values,
                                         f"a rounding-bound miss parity explore --seed {result.seed} met; it failed at "
                                         f"{len(u.failed_seeds)} of {len(u.seeds)} other seeds")
                               for u in result.unconfirmed))
    made = {c.id: c for c in load_file(path)}
    for u in result.unconfirmed:
        if u.verdict.case.id not in made:
            raise RuntimeError(f"{path} does not make {u.verdict.case.id}")
        u.verdict.case = replace(u.verdict.case, source=f"{path}:matrix")
    return path
