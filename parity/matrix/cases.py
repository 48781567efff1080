"""Declarative case matrices: TOML file -> validated, expanded, stably ordered cases.

A file holds one or more ``[[matrix]]`` tables:

    [[matrix]]
    subject = "vocab_parallel"          # a name from parity.subjects.SUBJECTS
    description = "..."                 # optional
    markers = ["slow"]                  # optional extra pytest markers
    [matrix.axes]                       # axis -> list of values (a scalar means one value)
    dtype = ["fp32", "bf16"]
    [[matrix.exclude]]                  # drop cases matching every key (values: scalar or list)
    dtype = "fp16"
    [[matrix.only]]                     # if present, keep only cases matching one of these
    [matrix.expect]                     # default: parity; or a rejection:
    error = "ValueError"
    match = "message fragment"
    [matrix.known_divergence]           # the subject is known to differ from the reference here:
    reason = "why, in a sentence"
    repro = "ci/repro/name.py"          # a standalone script a maintainer can run (must exist)
    checks = ["grad"]                   # the checks allowed to fail (name, or name prefix before '[')
    raises = "RuntimeError: fragment"   # or: the subject crashes here; some rank must raise this ("Type: message"
                                        # fragment), the others may only lose their peer; checks then unused
    any_size = true                     # optional: the mechanism in `reason` holds at every size (vocab, hidden,
                                        # tp, dp, gas, grain, chunk), so `parity explore` may carry the mark to
                                        # sizes the table does not list (parity/explore/known.py); never for a
                                        # decision only some sizes take
    binds = ["padding"]                 # optional: the only axes of the table (besides `where`) the mechanism
                                        # depends on; parity explore carries the mark to any case of the subject
                                        # these admit (its other axes free, parity/explore/known.py); one the table
                                        # does not list binds at its default; [] = `where` alone. A statement
                                        # about the mechanism, as any_size is
    uneven_vocab = true                 # optional: the mechanism needs TP shards of unequal size (the suite's
                                        # formula at the case's vocab, tp and grain); parity explore carries the
                                        # mark to no case whose vocabulary splits evenly
    [[matrix.known_divergence]]         # or several, each limited to the cases it names:
    where = { zero = [0], dtype = ["bf16"] }   # (axis -> values, as [[matrix.only]]); a case under more
                                        # than one gets them merged (reasons and repros joined, checks united)
    mark = "zero0_grad_dtype"           # or a named mark of cases/marks/known_divergence.toml: its
                                        # [mark.NAME] table gives the keys above but `where`; the entry adds
                                        # `where` and any key the mark leaves out, and may not repeat one it sets
    finding = "deepspeed_..."           # optional: the root cause (findings/<id>.toml) the entry is an instance
                                        # of; a mark gives its own, an entry without one takes the finding that
                                        # lists its reproducer (findings_by_repro)
    [matrix.collectives]                # collectives per micro-batch (forward + backward of head and
    all_reduce = 4                      # loss), per rank, exact: kind = n on a group of size tp, or
    "all_reduce@4" = 1                  # "kind@N" = n on a group of size N; any other collective fails
    [matrix.collectives.first]          # on top, on the first micro-batch of the case only (one-time
    all_gather_into_tensor = 1          # set-up, e.g. a shard-layout validation); parity/observe/collectives.py

Axes not listed take their default. Cases come out in the cartesian order of the subject's axes
and the file's value order, so the same file gives the same ids in the same order every time.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from parity.axes import AXES
from parity.settings import CASES_DIR_VAR, RunSettings
from parity.subjects import SUBJECTS
from parity.subjects.values import CaseValues, resolve, subject_axes  # noqa: F401 (subject_axes: re-exported)

MATRIX_KEYS = ("subject", "description", "markers", "axes", "exclude", "only", "expect", "known_divergence",
               "collectives")
EXPECT_KEYS = ("error", "match")
# The checks a rejection case has (parity/harness/runner.py _rejection_verdict).
REJECTION_CHECKS = ("rejection", "state_after_rejection", "process_state_after_rejection")
DIVERGENCE_KEYS = ("reason", "repro", "checks", "raises", "where", "any_size", "binds", "uneven_vocab", "mark",
                   "finding")
# A named mark is one mechanism, said once for every case file that meets it; `where` stays with each
# entry, since it names axes of that entry's subject.
NAMED_MARK_KEYS = tuple(k for k in DIVERGENCE_KEYS if k not in ("where", "mark"))
# The case files and ci/repro/ live beside the package in a checkout; an installed wheel carries
# neither, so PARITY_CASES_DIR (RunSettings.cases_dir) points at a checkout's cases/ (repro paths
# resolve from its parent). Fixed at import: the marks file and every default selection derive from it.
CASES_DIR = Path(RunSettings.from_env().cases_dir or Path(__file__).resolve().parents[2] / "cases").resolve()
# Beside the case files, in a folder of its own: cases/*.toml are all case files (the pytest collector,
# the CI family list and several tests glob them).
MARKS_FILE = CASES_DIR / "marks" / "known_divergence.toml"
# The registry of root causes, one TOML file per finding, at the repository root beside cases/ and ci/repro/.
FINDINGS_DIR = CASES_DIR.parent / "findings"
FINDING_KEYS = ("id", "title", "library", "versions", "class", "mechanism", "reproducers", "marks", "upstream", "fix")
FINDING_OPTIONAL_KEYS = ("notes",)  # the story: how it was found, measured numbers, the cases that show it
FINDING_CLASSES = ("silent wrong numbers", "crash on an accepted configuration", "misconfiguration accepted silently",
                   "convention difference", "state left behind")
# Reproducers under this folder each belong to exactly one finding; a repro elsewhere (a test's fixture) is named
# by its stem.
REPRO_DIR = "ci/repro/"


class SelectionError(ValueError):
    """A command line's case selection that cannot be honoured (bad -k, unknown id): a usage error."""


class CaseFileError(ValueError):
    """A malformed case file: says which file, which key, and what is allowed."""

    def __init__(self, path, key: str, problem: str, allowed: str | None = None):
        self.path, self.key, self.problem, self.allowed = str(path), key, problem, allowed
        text = f"{path}: {key}: {problem}"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)


@dataclass(frozen=True)
class Expectation:
    error: str | None = None  # exception class name; None means numerical parity
    match: str = ""

    @property
    def is_error(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class KnownDivergence:
    reason: str
    repro: str
    checks: tuple = ()  # empty: any numerical check may fail
    raises: str = ""  # a crash, not a number: "Type: message" fragment some rank must raise
    any_size: bool = False  # the case file says the mechanism holds at every size (parity explore may carry it)
    binds: tuple | None = None  # the axes the mechanism depends on, where the case file names them (explore)
    # the mechanism needs unequal vocabulary shards (equal ones give every TP rank the same layout): explore
    # carries the mark to no case whose vocabulary splits evenly
    uneven_vocab: bool = False
    # The finding's id (findings/<id>.toml): the entry's or its mark's `finding`, else the finding that lists its
    # reproducer (finding_name). Not part of what the divergence is: an entry spelled out equals its mark.
    name: str = field(default="", compare=False)
    parts: tuple = field(default=(), compare=False)  # under several divergences: each of them, judged apart

    def covers(self, check_name: str) -> bool:
        return not self.checks or any(check_name == c or check_name.split("[")[0] == c for c in self.checks)

    @property
    def findings(self) -> tuple:
        """The divergences this mark stands for, each still present or fixed on its own checks."""
        return self.parts or (self,)


@dataclass(frozen=True)
class Case:
    id: str
    subject: str
    axes: tuple  # ((axis, value), ...) in the subject's order
    expect: Expectation = field(default_factory=Expectation)
    source: str = ""
    markers: tuple = ()
    divergence: KnownDivergence | None = None
    collectives: tuple = ()  # ((kind or "kind@N", count), ...) per micro-batch, from [matrix.collectives]
    # ((source, KnownDivergence), ...): case-file marks whose scope admits this unmarked case (parity check's cases,
    # parity/explore/known.py); the judge tries them only where the case fails without a mark
    admitted: tuple = ()

    @functools.cached_property
    def values(self) -> CaseValues:
        """Resolved once per case: what the harness, the checks and the rank processes hand the subject."""
        return resolve(SUBJECTS[self.subject], dict(self.axes))

    def __getitem__(self, axis: str):
        return self.values[axis]

    @property
    def world_size(self) -> int:
        return SUBJECTS[self.subject].world_size(self.values)

    def as_dict(self) -> dict:
        return {"id": self.id, "subject": self.subject, "axes": dict(self.values), "source": self.source,
                "expect": {"error": self.expect.error, "match": self.expect.match} if self.expect.is_error
                else "parity", "markers": list(self.markers),
                "known_divergence": None if self.divergence is None else {
                    "findings": [f.name for f in self.divergence.findings],
                    "reason": self.divergence.reason, "repro": self.divergence.repro,
                    "checks": list(self.divergence.checks), "raises": self.divergence.raises or None},
                "collectives": {k: dict(v) if k == "first" else v for k, v in self.collectives} or None}


def case_id(subject: str, values: dict) -> str:
    shown = [a for a in subject_axes(SUBJECTS[subject])
             if not (AXES[a].quiet_default and values[a] == AXES[a].default)]
    return "-".join([subject] + [AXES[a].label(values[a]) for a in shown])


def _as_list(value):
    return list(value) if isinstance(value, list) else [value]


def _check_value(path, key, axis_name, allowed_values, value):
    axis = AXES[axis_name]
    if not axis.accepts(value):
        raise CaseFileError(path, key, f"bad value {value!r} for axis '{axis_name}'", axis.allowed())
    if allowed_values is not None and value not in allowed_values:
        raise CaseFileError(path, key, f"value {value!r} is not supported by this subject",
                            ", ".join(map(repr, allowed_values)))


def _rules(path, where, rules, subject) -> list[dict]:
    if not isinstance(rules, list) or not all(isinstance(r, dict) and r for r in rules):
        raise CaseFileError(path, where, "must be an array of non-empty tables ([[...]])")
    checked = []
    for i, rule in enumerate(rules):
        entry = {}
        for axis_name, raw in rule.items():
            key = f"{where}[{i}].{axis_name}"
            if axis_name not in subject_axes(subject):
                raise CaseFileError(path, key, f"unknown axis for subject '{subject.name}'",
                                    ", ".join(subject_axes(subject)))
            values = _as_list(raw)
            for v in values:
                _check_value(path, key, axis_name, subject_axes(subject)[axis_name], v)
            entry[axis_name] = values
        checked.append(entry)
    return checked


def _matches(rule: dict, values: dict) -> bool:
    return all(values[a] in allowed for a, allowed in rule.items())


def expand_matrix(path, index: int, table: dict) -> list[Case]:
    where = f"matrix[{index}]"
    if not isinstance(table, dict):
        raise CaseFileError(path, where, "must be a table")
    for key in table:
        if key not in MATRIX_KEYS:
            raise CaseFileError(path, f"{where}.{key}", "unknown key", ", ".join(MATRIX_KEYS))
    subject_name = table.get("subject")
    if subject_name not in SUBJECTS:
        raise CaseFileError(path, f"{where}.subject", f"unknown subject {subject_name!r}", ", ".join(SUBJECTS))
    subject = SUBJECTS[subject_name]

    axes_table = table.get("axes", {})
    if not isinstance(axes_table, dict):
        raise CaseFileError(path, f"{where}.axes", "must be a table of axis = [values]")
    choices = {}
    for axis_name in subject_axes(subject):
        raw = axes_table.get(axis_name, subject.defaults.get(axis_name, AXES[axis_name].default))
        values = _as_list(raw)
        if not values:
            raise CaseFileError(path, f"{where}.axes.{axis_name}", "empty list of values")
        for v in values:
            _check_value(path, f"{where}.axes.{axis_name}", axis_name, subject_axes(subject)[axis_name], v)
        choices[axis_name] = values
    for axis_name in axes_table:
        if axis_name not in subject_axes(subject):
            raise CaseFileError(path, f"{where}.axes.{axis_name}", f"unknown axis for subject '{subject_name}'",
                                ", ".join(subject_axes(subject)))

    excludes = _rules(path, f"{where}.exclude", table.get("exclude", []), subject)
    onlys = _rules(path, f"{where}.only", table["only"], subject) if "only" in table else None

    expect_table = table.get("expect", {})
    if not isinstance(expect_table, dict):
        raise CaseFileError(path, f"{where}.expect", "must be a table with error and match")
    for key in expect_table:
        if key not in EXPECT_KEYS:
            raise CaseFileError(path, f"{where}.expect.{key}", "unknown key", ", ".join(EXPECT_KEYS))
    if "match" in expect_table and "error" not in expect_table:
        raise CaseFileError(path, f"{where}.expect.match", "given without expect.error")
    expect = Expectation(expect_table.get("error"), str(expect_table.get("match", "")))

    raw_divergences = table.get("known_divergence")
    if isinstance(raw_divergences, list):
        keyed = [(f"{where}.known_divergence[{i}]", d) for i, d in enumerate(raw_divergences)]
    else:
        keyed = [] if raw_divergences is None else [(f"{where}.known_divergence", raw_divergences)]
    divergences = []
    for key, raw in keyed:
        scope = raw.get("where") if isinstance(raw, dict) else None
        rule = _rules(path, f"{key}.where", [scope], subject)[0] if scope is not None else None
        divergence = _divergence(path, key, raw, subject)
        if divergence and expect.is_error and set(divergence.checks) - set(REJECTION_CHECKS):
            # A rejection case has no numerical checks: only the rejection itself and what it left behind
            # (parity.checks.compare.state_after_rejection_checks) can be named.
            bad = sorted(set(divergence.checks) - set(REJECTION_CHECKS))
            # Checks a named mark gives are the mark's: the entry holds only its name.
            at = f"{key}.mark" if "mark" in raw and "checks" not in raw else f"{key}.checks"
            raise CaseFileError(path, at, f"{bad} not allowed with expect.error", ", ".join(REJECTION_CHECKS))
        divergences.append((rule, divergence))

    declared = _collectives(path, f"{where}.collectives", table.get("collectives"))
    if declared and expect.is_error:
        raise CaseFileError(path, f"{where}.collectives", "cannot be combined with expect.error")

    markers = table.get("markers", [])
    if not isinstance(markers, list) or not all(isinstance(m, str) and m.isidentifier() for m in markers):
        raise CaseFileError(path, f"{where}.markers", "must be a list of identifiers", "e.g. [\"slow\"]")

    cases = []
    for combo in itertools.product(*choices.values()):
        values = resolve(subject, dict(zip(choices, combo)))
        if any(_matches(r, values) for r in excludes):
            continue
        if onlys is not None and not any(_matches(r, values) for r in onlys):
            continue
        problem = subject.invalid(values)
        if problem:
            raise CaseFileError(path, f"{where}.axes", f"{case_id(subject_name, values)}: {problem}")
        divergence = _merged(path, where, [d for rule, d in divergences if rule is None or _matches(rule, values)])
        cases.append(Case(id=case_id(subject_name, values), subject=subject_name, axes=tuple(values.items()),
                          expect=expect, source=f"{path}:{where}", divergence=divergence, collectives=declared,
                          markers=tuple(subject.markers(values)) + tuple(markers)))
    if not cases:
        raise CaseFileError(path, where, "expands to no cases (check axes, exclude and only)")
    return cases


def _display(path: Path) -> str:
    """Repository-relative where possible, so ids, sources and repro commands read the same everywhere."""
    try:
        return str(path.resolve().relative_to(CASES_DIR.parent))
    except ValueError:
        return str(path)


def named_marks() -> dict:
    """The named marks (cases/marks/known_divergence.toml): name -> its table, each validated as a
    known_divergence entry is (no subject: binds meet each entry's subject where it is named)."""
    try:
        stamp = MARKS_FILE.stat().st_mtime_ns
    except OSError:
        stamp = None
    return _named_marks(str(MARKS_FILE), stamp)


def _read_toml(path: Path, named, top: str):
    """The one top-level key a case or marks file may hold, read from path; errors name the file as `named`."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CaseFileError(named, "(syntax)", str(exc)) from None
    except OSError as exc:
        raise CaseFileError(named, "(file)", exc.strerror or str(exc)) from None
    for key in data:
        if key != top:
            raise CaseFileError(named, key, "unknown top-level key", top)
    return data.get(top)


@functools.lru_cache(maxsize=4)
def _named_marks(path: str, stamp) -> dict:
    """Read once per load (every entry naming a mark asks); a changed file is read again."""
    path = Path(path)
    shown = _display(path)
    tables = _read_toml(path, shown, "mark")
    if not isinstance(tables, dict) or not tables:
        raise CaseFileError(shown, "mark", "no [mark.NAME] tables")
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise CaseFileError(shown, f"mark.{name}", "must be a table", ", ".join(NAMED_MARK_KEYS))
        for key in table:
            if key not in NAMED_MARK_KEYS:
                raise CaseFileError(shown, f"mark.{name}.{key}", "unknown key", ", ".join(NAMED_MARK_KEYS))
        _divergence(shown, f"mark.{name}", table, name=name)
    return tables


def _resolved(path, where, table) -> dict:
    """A known_divergence entry with its named mark's keys filled in; an entry without one as it is."""
    if "mark" not in table:
        return table
    name = table["mark"]
    marks = named_marks()
    if not isinstance(name, str) or name not in marks:
        raise CaseFileError(path, f"{where}.mark", f"unknown mark {name!r} (no [mark.{name}] in "
                            f"{_display(MARKS_FILE)})", ", ".join(sorted(marks)))
    # One source for each key: an entry that restated a key of its mark could quietly say otherwise.
    again = sorted(set(table) & set(marks[name]))
    if again:
        raise CaseFileError(path, f"{where}.{again[0]}", f"already set by mark {name!r}",
                            f"keys mark {name!r} leaves out: "
                            + (", ".join(k for k in DIVERGENCE_KEYS if k not in marks[name] and k != "mark")))
    return {**marks[name], **{k: v for k, v in table.items() if k != "mark"}}


def _divergence(path, where, table, subject=None, name=None) -> KnownDivergence | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise CaseFileError(path, where, "must be a table", ", ".join(DIVERGENCE_KEYS))
    for key in table:
        if key not in DIVERGENCE_KEYS:
            raise CaseFileError(path, f"{where}.{key}", "unknown key", ", ".join(DIVERGENCE_KEYS))
    own, table = table, _resolved(path, where, table)
    for key in ("reason", "repro"):
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise CaseFileError(path, f"{where}.{key}", "required, a non-empty string")
    if not (CASES_DIR.parent / table["repro"]).is_file():
        raise CaseFileError(path, f"{where}.repro", f"no such file {table['repro']!r} (relative to the repo root)")
    checks = table.get("checks", [])
    if not isinstance(checks, list) or not all(isinstance(c, str) for c in checks):
        raise CaseFileError(path, f"{where}.checks", "must be a list of check names")
    raises = table.get("raises", "")
    if not isinstance(raises, str) or ("raises" in table and ": " not in raises):
        raise CaseFileError(path, f"{where}.raises", f"bad value {raises!r}", "'ExceptionType: message fragment'")
    any_size = table.get("any_size", False)
    if not isinstance(any_size, bool):
        raise CaseFileError(path, f"{where}.any_size", f"bad value {any_size!r}", "true or false")
    binds = table.get("binds")
    if binds is not None:
        known = set(getattr(subject, "axes", None) or ())
        if not isinstance(binds, list) or not all(isinstance(a, str) for a in binds):
            raise CaseFileError(path, f"{where}.binds", f"bad value {binds!r}", "a list of axis names")
        unknown = [a for a in binds if known and a not in known]
        if unknown:
            key, problem = f"{where}.binds", f"not an axis of the subject: {unknown[0]!r}"
            if "binds" not in own:  # the named mark's: the entry holds only its name
                key, problem = f"{where}.mark", f"mark {own['mark']!r}: binds {problem}"
            raise CaseFileError(path, key, problem, ", ".join(sorted(known)))
        binds = tuple(binds)
    uneven_vocab = table.get("uneven_vocab", False)
    if not isinstance(uneven_vocab, bool):
        raise CaseFileError(path, f"{where}.uneven_vocab", f"bad value {uneven_vocab!r}", "true or false")
    if "finding" in table:
        known = findings()
        if not isinstance(table["finding"], str) or table["finding"] not in known:
            key = f"{where}.finding" if "finding" in own else f"{where}.mark"
            raise CaseFileError(path, key, f"unknown finding {table['finding']!r} (no {_display(FINDINGS_DIR)}/"
                                f"{table['finding']}.toml)", ", ".join(sorted(known)))
        name = table["finding"]
    else:
        name = name or (own["mark"] if "mark" in own else finding_name(table["repro"], path, f"{where}.repro"))
    return KnownDivergence(" ".join(table["reason"].split()), table["repro"], tuple(checks), raises, any_size, binds,
                           uneven_vocab, name)


def finding_name(repro: str, path="", where="repro") -> str:
    """The finding an entry without a `finding` of its own is an instance of: the one findings/*.toml file whose
    `reproducers` lists its reproducer. A reproducer outside ci/repro/ (a test's fixture) is named by its stem."""
    if not repro.startswith(REPRO_DIR):
        return Path(repro).stem
    owners = findings_by_repro().get(repro, [])
    if len(owners) != 1:
        problem = (f"reproducer {repro!r} belongs to no finding (list it in the `reproducers` of one "
                   f"{_display(FINDINGS_DIR)}/*.toml)" if not owners else
                   f"reproducer {repro!r} belongs to {len(owners)} findings ({', '.join(owners)}): one cause each")
        raise CaseFileError(path, where, problem)
    return owners[0]


def findings() -> dict:
    """The findings registry (findings/*.toml): id -> its table, each validated; {} where there is no folder."""
    files = sorted(FINDINGS_DIR.glob("*.toml")) if FINDINGS_DIR.is_dir() else []
    return _findings(tuple((str(f), f.stat().st_mtime_ns) for f in files))


def findings_by_repro() -> dict:
    """Reproducer path -> the ids of the findings that list it (a valid registry has one each)."""
    owners = {}
    for fid, table in findings().items():
        for repro in table["reproducers"]:
            owners.setdefault(repro, []).append(fid)
    return owners


@functools.lru_cache(maxsize=4)
def _findings(stamped: tuple) -> dict:
    """Read once per set of files and stamps; a changed file is read again."""
    out = {}
    for name, _ in stamped:
        path = Path(name)
        shown = _display(path)
        try:
            table = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise CaseFileError(shown, "(syntax)", str(exc)) from None
        unknown = [k for k in table if k not in FINDING_KEYS + FINDING_OPTIONAL_KEYS]
        missing = [k for k in FINDING_KEYS if k not in table]
        if unknown or missing:
            raise CaseFileError(shown, (unknown or missing)[0], "unknown key" if unknown else "required",
                                ", ".join(FINDING_KEYS + FINDING_OPTIONAL_KEYS))
        if table["id"] != path.stem:
            raise CaseFileError(shown, "id", f"{table['id']!r} is not the file's stem {path.stem!r}")
        if table["class"] not in FINDING_CLASSES:
            raise CaseFileError(shown, "class", f"bad value {table['class']!r}", "; ".join(FINDING_CLASSES))
        for key in ("versions", "reproducers", "marks"):
            if not isinstance(table[key], list) or not all(isinstance(v, str) for v in table[key]):
                raise CaseFileError(shown, key, "must be a list of strings")
        for key in ("title", "library", "mechanism", "upstream", "fix"):
            if not isinstance(table[key], str) or not table[key].strip():
                raise CaseFileError(shown, key, "required, a non-empty string")
        if "notes" in table and (not isinstance(table["notes"], str) or not table["notes"].strip()):
            raise CaseFileError(shown, "notes", "a non-empty string when present")
        out[table["id"]] = table
    return out


def _merged(path, where, found: list) -> KnownDivergence | None:
    """One case under several documented divergences: each may explain its checks."""
    if len(found) <= 1:
        return found[0] if found else None
    if any(d.raises for d in found):
        raise CaseFileError(path, f"{where}.known_divergence", "a crash divergence (raises) cannot overlap another")
    return merged_divergence(found)


def merged_divergence(found: list) -> KnownDivergence:
    """Numerical divergences one case is under, as one: reasons and repros joined, checks united."""
    checks = () if any(not d.checks for d in found) else tuple(dict.fromkeys(c for d in found for c in d.checks))
    # Marks of one root cause met by one case are one finding, present where any of their checks fails.
    by_name = {}
    for p in (p for d in found for p in d.findings):
        by_name.setdefault(p.name, []).append(p)
    parts = tuple(same[0] if len(same) == 1 else _one_finding(same) for same in by_name.values())
    return KnownDivergence(" | ".join(d.reason for d in found), "; ".join(d.repro for d in found), checks,
                           any_size=all(d.any_size for d in found),
                           name=" + ".join(dict.fromkeys(d.name for d in found)), parts=parts)


def _one_finding(same: list) -> KnownDivergence:
    """Divergences of one finding met by one case, as one part: reasons and repros joined, checks united."""
    checks = () if any(not d.checks for d in same) else tuple(dict.fromkeys(c for d in same for c in d.checks))
    return KnownDivergence(" | ".join(d.reason for d in same), "; ".join(d.repro for d in same), checks,
                           any_size=all(d.any_size for d in same), name=same[0].name)


def _collectives(path, where, table) -> tuple:
    from parity.observe.collectives import KINDS

    if table is None:
        return ()
    allowed = ", ".join(KINDS) + " (each optionally '@<group size>'), or a [first] table"
    if not isinstance(table, dict) or not table:
        raise CaseFileError(path, where, "must be a non-empty table of kind = count", allowed)
    out = []
    for key, n in table.items():
        if key == "first":  # extra collectives of the case's first micro-batch only (one-time set-up)
            out.append(("first", _collectives(path, f"{where}.first", n)))
            continue
        kind, _, size = key.partition("@")
        if kind not in KINDS or (_ and not (size.isdigit() and int(size) > 0)) or where.endswith(".first.first"):
            raise CaseFileError(path, f"{where}.{key}", "unknown collective", allowed)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise CaseFileError(path, f"{where}.{key}", f"bad count {n!r}", "an integer >= 0")
        out.append((key, n))
    return tuple(out)


def load_file(path) -> list[Case]:
    path = Path(path)
    shown = _display(path)
    matrices = _read_toml(path, path, "matrix")
    if not isinstance(matrices, list) or not matrices:
        raise CaseFileError(path, "matrix", "no [[matrix]] tables")
    cases = [c for i, m in enumerate(matrices) for c in expand_matrix(shown, i, m)]
    return _unique(cases)


def _unique(cases: list[Case]) -> list[Case]:
    seen = {}
    for c in cases:
        if c.id in seen:
            raise CaseFileError(c.source, "id", f"duplicate case id {c.id!r}, also produced by {seen[c.id]}")
        seen[c.id] = c.source
    return cases


def default_files() -> list[Path]:
    files = sorted(CASES_DIR.glob("*.toml"))
    if not files:
        raise CaseFileError(CASES_DIR, CASES_DIR_VAR, "no case files (*.toml) in this directory; an installed "
                            "wheel carries none: set PARITY_CASES_DIR to a checkout's cases/ or pass --matrix FILE")
    return files


def load(paths=None) -> list[Case]:
    files = [Path(p) for p in paths] if paths else default_files()
    return _unique([c for f in files for c in load_file(f)])


def at_seed(case: Case, seed: int) -> Case:
    """The same case at another seed (initial weights and data): the seed axis replaced, the id
    rebuilt from it (seed 0, the default, keeps the id the case file gives)."""
    if not AXES["seed"].accepts(seed):
        raise SelectionError(f"bad seed {seed!r}: {AXES['seed'].allowed()}")
    values = case.values.replace(seed=seed)
    return dataclasses.replace(case, id=case_id(case.subject, values), axes=tuple(values.items()))


def at_seeds(cases, seeds) -> list[Case]:
    """Every case at every seed, seed-major: all cases at the first seed, then the next, so cases
    sharing a reference_key meet in the reference cache while their seed's references are in it."""
    return [at_seed(c, s) for s in seeds for c in cases]


def _seeded_case(by_id: dict, case_id_: str) -> Case | None:
    """A case file's case at a seed other than its own, named by the id a seeded run gave it (the
    seed label comes last, the seed axis being universal), so a seeded failure's reproducer
    `parity run --case ID-seedN` works without --seed."""
    base, sep, seed = case_id_.rpartition("-seed")
    if sep and seed.isdigit() and base in by_id and by_id[base].values["seed"] == 0:
        return at_seed(by_id[base], int(seed))
    return None


def seed_list(seed: int | None, seeds: int | None) -> list[int] | None:
    """`parity run --seed N` -> [N]; `--seeds K` -> [0, ..., K-1] (0 is the default seed, so a K-seed
    run contains the plain run); neither -> None (each case at the seed its case file gives)."""
    if seed is not None and seeds is not None:
        raise SelectionError("--seed and --seeds both pick the seeds: give one of them")
    if seed is not None:
        return [seed]
    return list(range(seeds)) if seeds is not None else None


def select(cases, keyword: str | None, case_ids: list[str] | None, device: str | None = None,
           framework: str | None = None):
    """The cases a command line picks: by device and framework, then exact ids (in the order given) or a -k
    expression. Shared by `parity list/run`, the torchrun launcher and pytest-free tools, so they all agree."""
    if device:
        cases = [c for c in cases if c.values.optional("device", "cpu") == device]
    if framework:
        from parity.subjects import FRAMEWORKS, SUBJECTS

        if framework not in FRAMEWORKS:
            raise SelectionError(f"--framework {framework!r}: unknown framework (valid: {', '.join(FRAMEWORKS)})")
        cases = [c for c in cases if SUBJECTS[c.subject].framework == framework]
    if case_ids:
        by_id = {c.id: c for c in cases}
        found = [by_id.get(i) or _seeded_case(by_id, i) for i in case_ids]
        unknown = [i for i, c in zip(case_ids, found) if c is None]
        if unknown:
            raise SelectionError(f"no case with id {unknown[0]!r} (see `parity list`)")
        return found
    if keyword:
        # pytest's own -k grammar (substring terms with and/or/not), so both entry points agree.
        from _pytest.mark import expression

        # pytest 9 raises SyntaxError(msg, (None, column, ...)); pytest 8 its own ParseError(column, message).
        errors = tuple(e for e in (SyntaxError, getattr(expression, "ParseError", None)) if e)
        try:
            expr = expression.Expression.compile(keyword)
        except errors as exc:
            column = getattr(exc, "offset", None) or getattr(exc, "column", "?")
            why = getattr(exc, "msg", None) or getattr(exc, "message", None) or str(exc)
            raise SelectionError(f"bad -k expression {keyword!r}: at column {column}: {why}") from None
        cases = [c for c in cases if expr.evaluate(lambda term, c=c: term.lower() in c.id.lower())]
    return cases
