"""Subject registry: every concrete Subject class of this package, plus the SUBJECTS lists of the modules named in
PARITY_SUBJECT_MODULES (docs/subjects.md#adding-a-subject)."""
from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import sys

from parity.subjects.base import Subject


def _package_subjects() -> list[Subject]:
    """One instance of every concrete Subject class with a public name in this package, in module-name order and
    then definition order: nothing lists a subject."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found += [cls() for cls in vars(module).values()
                  if isinstance(cls, type) and issubclass(cls, Subject) and cls.__module__ == module.__name__
                  and not inspect.isabstract(cls) and cls.name and not cls.name.startswith("_")]
    return found


SUBJECTS = {s.name: s for s in _package_subjects()}
ENV_VAR = "PARITY_SUBJECT_MODULES"


def _frameworks() -> tuple:
    """The frameworks under test (Subject.framework) in first-registered order, as `parity run/list --framework`
    names them."""
    return tuple(dict.fromkeys(s.framework for s in SUBJECTS.values()))


FRAMEWORKS = _frameworks()


class SubjectModuleError(ImportError):
    """A PARITY_SUBJECT_MODULES entry that cannot be imported or has no SUBJECTS: a usage error.
    Raised while parity.subjects itself is being imported, so callers recognise it by this flag."""
    usage_error = True


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        # Only a miss of the named module itself (not of something it imports) earns the retry.
        if not exc.name or not (name == exc.name or name.startswith(exc.name + ".")) or here in sys.path:
            raise
        sys.path.append(here)  # appended: the current directory never shadows installed packages
        return importlib.import_module(name)


def register_modules(names: str) -> None:
    for module in filter(None, (n.strip() for n in names.split(","))):
        try:
            imported = _import(module)
        except ImportError as exc:
            raise SubjectModuleError(f"{ENV_VAR}: cannot import {module!r} (looked on sys.path and in "
                                     f"{os.getcwd()}): {exc}") from None
        if not hasattr(imported, "SUBJECTS"):
            raise SubjectModuleError(f"{ENV_VAR}: module {module!r} has no SUBJECTS list")
        for subject in imported.SUBJECTS:
            SUBJECTS[subject.name] = subject
    global FRAMEWORKS
    FRAMEWORKS = _frameworks()


def add_subject_modules(names: str) -> None:
    """Register here and in every rank process started from now on."""
    current = [n for n in os.environ.get(ENV_VAR, "").split(",") if n]
    os.environ[ENV_VAR] = ",".join(current + [n for n in names.split(",") if n not in current])
    register_modules(names)


register_modules(os.environ.get(ENV_VAR, ""))
