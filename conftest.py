"""pytest face of the suite: every case in cases/*.toml is a test with its case id.

Markers: cpu / gpu, liger, slow, worldN, case. `pytest -k`, `-m` and `-n 2` (xdist) work; each
xdist worker keeps its own rank groups, and ports never collide because each group's rendezvous
store is bound by its own parent process on a port the OS chose.
"""
from __future__ import annotations

import warnings

import pytest

from parity.cases import load
from parity.verdict import DIVERGED, FAILED, SKIPPED, XPASSED


def pytest_collect_file(parent, file_path):
    if file_path.suffix == ".toml" and file_path.parent.name == "cases" and file_path.parent.parent == parent.config.rootpath:
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.File):
    def collect(self):
        for case in load([self.path]):
            item = CaseItem.from_parent(self, name=case.id, case=case)
            for marker in ("case",) + case.markers:
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
            from parity.runner import Runner, strict_from_env

            runner = Runner(strict=strict_from_env())
            self.session.config.stash[_runner_key] = runner
        verdict = runner.run(self.case)
        self.user_properties.append(("verdict", verdict.as_dict()))
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


def pytest_sessionfinish(session):
    runner = session.config.stash.get(_runner_key, None)
    if runner is not None:
        runner.close()
