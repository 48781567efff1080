"""pytest face of the suite: every case in cases/*.toml is a test with its case id.

Markers: cpu / gpu, liger, slow, worldN, case. `pytest -k`, `-m` and `-n 2` (xdist) work; each
xdist worker keeps its own rank groups, and ports never collide because each group's rendezvous
store is bound by its own parent process on a port the OS chose.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from parity.matrix.cases import load
from parity.checks.verdict import DIVERGED, FAILED, SKIPPED, XPASSED


def pytest_addoption(parser):
    parser.addoption("--parity-report", metavar="DIR", default=None,
                     help="write the suite's report (DIR/summary.json, ...) for the cases this run ran")
    parser.addoption("--parity-reference-cache", metavar="DIR", default=None,
                     help="keep every computed reference in DIR, keyed by content, shared by the xdist workers "
                          "and later runs (parity run --reference-cache DIR)")


def pytest_configure(config):
    from parity.hash_seed import pinned, restart_pinned
    from parity.settings import RunSettings

    if not pinned():  # the cases' rounding samples need str hashes pinned (parity/hash_seed.py): start again
        capture = config.pluginmanager.getplugin("capturemanager")  # None under -p no:capture
        if capture is not None:
            capture.stop_global_capturing()  # the real stdout and stderr back before the exec
        restart_pinned()

    cache = config.getoption("--parity-reference-cache")
    if cache is not None:  # on every xdist worker too: each computes its cases' references
        if Path(cache).exists() and not Path(cache).is_dir():
            raise pytest.UsageError(f"--parity-reference-cache {cache}: exists and is not a directory "
                                    "(allowed: a directory, created if missing)")
    # The session's run settings, built once: the PARITY_* variables and the option above.
    config.stash[_settings_key] = RunSettings.from_env(**({"reference_disk": cache} if cache is not None else {}))
    directory = config.getoption("--parity-report")
    if directory is None or hasattr(config, "workerinput"):  # xdist workers only send their reports
        return
    if Path(directory).exists() and not Path(directory).is_dir():
        raise pytest.UsageError(f"--parity-report {directory}: exists and is not a directory "
                                "(allowed: a directory, created if missing)")
    config.pluginmanager.register(ParityReport(directory, ["pytest", *config.invocation_params.args]),
                                  "parity-report")


class ParityReport:
    """Collects every case's verdict where pytest reports it and writes the suite's report at the end.

    pytest_runtest_logreport runs on the xdist controller for every worker's report, so the full
    verdict (with its per-check list) travels in the report's user_properties and no worker has to
    write a part of its own. Registered on the controller only: a worker must send it unstripped.
    """

    def __init__(self, directory: str, argv: list[str]):
        self.directory, self.argv = directory, argv
        self.records: list[dict] = []
        self.start = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        # tryfirst: the JUnit XML writer, which runs later, must not see the per-check list.
        full = [value for name, value in report.user_properties if name == FULL_RECORD]
        report.user_properties[:] = [(n, v) for n, v in report.user_properties if n != FULL_RECORD]
        if report.when == "call":
            self.records.extend(full)

    def pytest_sessionfinish(self, session):
        from parity.report.console import write_report

        write_report(self.directory, self.records, time.monotonic() - self.start, argv=self.argv)


FULL_RECORD = "parity_record"  # user property: the whole verdict dict, only with --parity-report


def pytest_collect_file(parent, file_path):
    if file_path.suffix == ".toml" and file_path.parent.name == "cases" and file_path.parent.parent == parent.config.rootpath:
        return CaseFile.from_parent(parent, path=file_path)
    return None


def _quick_ids(config) -> frozenset:
    """The ids of the committed quick selection (cases/quick.txt), read once: they get the `quick` marker."""
    if _quick_key not in config.stash:
        from parity.matrix.quick import QUICK_FILE, quick_ids

        config.stash[_quick_key] = frozenset(quick_ids() if QUICK_FILE.exists() else ())
    return config.stash[_quick_key]


class CaseFile(pytest.File):
    def collect(self):
        quick = _quick_ids(self.config)
        for case in load([self.path]):
            item = CaseItem.from_parent(self, name=case.id, case=case)
            for marker in ("case",) + case.markers + (("quick",) if case.id in quick else ()):
                item.add_marker(marker)
            yield item


class CaseFailure(AssertionError):
    pass


class CaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def runtest(self):
        runner = self.session.config.stash.get(_runner_key, None)
        if runner is None:
            from parity.harness.runner import Runner

            runner = Runner(self.session.config.stash[_settings_key])
            self.session.config.stash[_runner_key] = runner
        verdict = runner.run(self.case)
        record = verdict.as_dict()
        compact = {k: v for k, v in record.items() if k != "check_results"}
        self.user_properties.append(("verdict", compact))
        if self.config.getoption("--parity-report"):
            self.user_properties.append((FULL_RECORD, record))
        if verdict.status == SKIPPED:
            pytest.skip(verdict.reason)
        if verdict.status == FAILED:
            raise CaseFailure(verdict.explain())
        if verdict.status == DIVERGED:
            pytest.xfail(verdict.reason)
        if verdict.status == XPASSED:
            warnings.warn(f"{self.case.id}: {verdict.reason}", stacklevel=1)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, CaseFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"case {self.case.id}"


_runner_key = pytest.StashKey()
_quick_key = pytest.StashKey()
_settings_key = pytest.StashKey()


def pytest_sessionfinish(session):
    runner = session.config.stash.get(_runner_key, None)
    if runner is not None:
        runner.close()
