"""A case's axis values as a subject reads them: resolved once, holding exactly the axes the subject declares.

``resolve(subject, values)`` fills every declared axis the given values leave out (the subject's ``defaults``,
else the axes registry's, parity/axes.py) and refuses an axis the subject does not declare. Reading an
undeclared axis is an error (``UndeclaredAxis``), not a silent default: shared code that serves subjects with
and without an axis says so with ``values.optional(axis, absent)``.
"""
from __future__ import annotations

from collections.abc import Mapping

from parity.axes import AXES, UNIVERSAL_AXES


class UndeclaredAxis(KeyError):
    """An axis the subject does not declare, read from or given to its case values."""

    def __init__(self, subject: str, axis: str, declared=()):
        self.subject, self.axis = subject, axis
        self.text = f"subject {subject!r} does not declare axis {axis!r}" + (
            f" (its axes: {', '.join(declared)})" if declared else "")
        super().__init__(self.text)

    def __str__(self):
        return self.text


def subject_axes(subject) -> dict:
    """The axes a subject's cases vary: its own, in its order, then the universal ones (seed)."""
    return {**subject.axes, **{a: None for a in UNIVERSAL_AXES if a not in subject.axes}}


class CaseValues(Mapping):
    """Immutable: axis -> value for exactly the subject's declared axes, in its case-id order."""

    __slots__ = ("_subject", "_values")

    def __init__(self, subject: str, values: dict):
        # Built by resolve() and replace() only: they make the values complete.
        object.__setattr__(self, "_subject", subject)
        object.__setattr__(self, "_values", dict(values))

    def __setattr__(self, name, value):
        raise AttributeError("CaseValues are immutable: use replace()")

    def __reduce__(self):  # pickled to the rank processes as it is, already resolved
        return (CaseValues, (self._subject, self._values))

    @property
    def subject(self) -> str:
        return self._subject

    def __getitem__(self, axis: str):
        try:
            return self._values[axis]
        except KeyError:
            raise UndeclaredAxis(self._subject, axis, tuple(self._values)) from None

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        return f"CaseValues({self._subject!r}, {self._values!r})"

    def __str__(self):  # as the plain dict printed before (rank logs: "=== case N: subject {...}")
        return str(self._values)

    def get(self, axis, default=None):
        raise TypeError(f"CaseValues.get({axis!r}, ...) would restate a default: read a declared axis as "
                        f"values[{axis!r}], or one the subject may not declare as values.optional({axis!r}, absent)")

    def optional(self, axis: str, absent):
        """The axis's value where the subject declares it; ``absent`` (the behaviour without the axis) where not."""
        return self._values[axis] if axis in self._values else absent

    def replace(self, **changes) -> "CaseValues":
        """The same case with some declared axes set otherwise (re-resolved: an undeclared one is refused)."""
        for axis in changes:
            if axis not in self._values:
                raise UndeclaredAxis(self._subject, axis, tuple(self._values))
        return CaseValues(self._subject, {**self._values, **changes})

    def widened(self, *axes: str, **values) -> "CaseValues":
        """These values with axes the subject does not vary added, for a subject reusing another's methods, which
        read axes it does not declare itself (a resume case reads its engine head's): ``axes`` at the registry's
        defaults (one the subject declares keeps its value), ``values`` as given (none the subject declares)."""
        for axis in values:
            if axis in self._values:
                raise ValueError(f"subject {self._subject!r} declares axis {axis!r}: replace() sets it")
        return CaseValues(self._subject, {**{a: AXES[a].default for a in axes}, **self._values, **values})


def resolve(subject, values: Mapping) -> CaseValues:
    """The case values of ``subject`` (a Subject) from ``values`` (any declared axes): every declared axis, in the
    subject's order, each given one as given, the others at the subject's default or the registry's."""
    declared = subject_axes(subject)
    for axis in values:
        if axis not in declared:
            raise UndeclaredAxis(subject.name, axis, tuple(declared))
    return CaseValues(subject.name, {a: values[a] if a in values else subject.defaults.get(a, AXES[a].default)
                                     for a in declared})
