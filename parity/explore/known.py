"""Is a failing explored case a documented divergence? The case files' own marks decide.

Two ways an explored case meets a mark:

1. Its twin: a default-matrix case with the same id and axes. The explored case is then that case,
   with its expectation, divergence mark and declared collectives, judged exactly as `parity run`
   judges it.
2. A mark that generalises: a ``[[matrix]]`` entry of the same subject with a ``known_divergence``
   (and no ``expect.error``) whose explicitly listed axes all admit the case; the axes it leaves at
   their defaults are free. A crash mark (``raises``) also frees the scale axes (vocab, hidden, tp,
   dp, gas, grain, chunk) it lists: its evidence, one rank raising that very error while the others
   merely lose their peer, is specific enough to carry over sizes (an empty shard at 5 over 4 is the
   one at 9 over 4). So does a contract mark (``checks`` all ``contract[...]``): its evidence is the
   dtype or device of the records it names, what a tensor is and not what it holds, which no size
   decides (ZeRO 0 hands back a bf16 gradient at vocab 2 as at 35), while every numerical check
   must still pass. A numerical mark's evidence is only a list of checks allowed to fail, which
   any bug of the same tensors would also meet, so it carries over nothing it lists: the Liger-gate
   mark (vocab 18, grain 4, tp 3) must not excuse a gradient miss at vocab 2 with equal shards.
   Unless its case file says ``any_size = true``: the mark's mechanism is a fact about code paths
   that every size takes (a mean over no target clamped to 1, a CE that overwrites the caller's
   fp32 logits, a clipping norm that skips TP ranks > 0's flattened gradients), so the checks it
   lists can fail at any size for that reason alone; found by explore seeds 4-7, which stopped on
   these divergences at vocabularies 2 and 195. The other axes it lists still bind.
3. A mark whose case file names the axes its mechanism depends on (``binds``): only those axes (at the
   table's values, or at the default where the table lists none) and its ``where`` bind; every other
   axis is free. The padding_idx that AutoTP's
   spec'd embedding drops trains the padding row under every ZeRO stage, dtype and clipping setting;
   marks listing the stages and settings where it was first seen stopped explore seeds 1, 13 and 14
   (H200 host's CPUs) at the same mechanism under ZeRO 2. Like ``any_size``, it is the case file's
   statement about the mechanism, and the evidence below still has to fit.
4. A mark that says ``uneven_vocab = true`` admits only cases whose vocabulary splits unevenly over tp (the
   suite's formula, parity/observe/partition.py, at the case's vocab, tp and grain): its mechanism is the
   TP ranks' unequal layouts, which no axis value names (3 over 2 and 55 over 2 are uneven, 4 and 54 not), and
   with equal shards the same check must still hold (explore seed 1 met the TP replicas of proj.weight drifting
   apart under bf16 masters at vocab 3 and 55).

A mark is only an explanation, and it must fit the evidence: the case's outcome is judged again
with the mark attached, and only a "diverged" verdict (every failed check covered by the mark's
``checks``, or the named crash on some rank with the others merely lost to it) makes it a known
divergence. A failure the mark does not cover stays a failure.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from parity.explore.domains import RANGES, default_of
from parity.observe.partition import split_sizes
from parity.matrix.cases import Case, KnownDivergence, _display, _divergence, default_files, expand_matrix, load
from parity.subjects import SUBJECTS

SCALE_AXES = frozenset(RANGES)


@dataclass(frozen=True)
class Mark:
    source: str  # "cases/file.toml:matrix[i]"
    subject: str
    # ((axis, allowed values), ...): the entry's explicit axes (a crash or contract mark's scale axes left out)
    axes: tuple
    divergence: KnownDivergence

    def admits(self, case: Case) -> bool:
        values = case.values
        return case.subject == self.subject and all(
            any(type(values[a]) is type(v) and values[a] == v for v in allowed) for a, allowed in self.axes) and (
            not self.divergence.uneven_vocab or uneven_vocab(case))


def uneven_vocab(case: Case) -> bool:
    """Whether the case's vocabulary shards differ in size, by the suite's formula and the subject's split."""
    values = case.values
    split = SUBJECTS[case.subject].claims(values).split
    return len(set(split_sizes(values["vocab"], values["tp"], values.optional("grain", 1), split))) > 1


def marks(paths=None) -> list[Mark]:
    """Every divergence mark of the case files that could generalise (expect.error entries do not:
    their whole point is one refusal)."""
    found = []
    for path in (Path(p) for p in (paths or default_files())):
        tables = tomllib.loads(path.read_text()).get("matrix", [])
        for i, table in enumerate(tables):
            if "known_divergence" not in table or "expect" in table:
                continue
            cases = expand_matrix(_display(path), i, table)  # validates the entry, parses its marks
            raw = table["known_divergence"]
            # A table may hold a list of marks, each limited to some of its cases by `where`: each one
            # generalises over the table's axes narrowed to its scope.
            for entry in raw if isinstance(raw, list) else [raw]:
                scope = {a: v if isinstance(v, list) else [v] for a, v in (entry.get("where") or {}).items()}
                first = next((c for c in cases if c.divergence is not None
                              and all(c.values[a] in v for a, v in scope.items())), None)
                if first is None:
                    continue
                # The entry's own mark, not the first case's: a case under several marks has them merged,
                # and what one mark carries must be only what its own mechanism explains (run_case unites
                # the marks a case meets).
                own = _divergence(_display(path), f"matrix[{i}].known_divergence", entry, SUBJECTS[table["subject"]])
                checks = own.checks
                sizeless = (own.any_size or bool(own.raises)
                            or (bool(checks) and all(c.startswith("contract[") for c in checks)))
                axes = {**table.get("axes", {}), **scope}
                if own.binds is not None:
                    # A bound axis the table leaves at its default binds at the default.
                    axes = {**{a: [default_of(table["subject"], a)] for a in own.binds},
                            **{a: v for a, v in axes.items() if a in own.binds or a in scope}}
                explicit = tuple((a, tuple(v if isinstance(v, list) else [v])) for a, v in axes.items()
                                 if not (sizeless and a in SCALE_AXES))
                found.append(Mark(first.source, table["subject"], explicit, own))
    return found


class Marks:
    """The default matrix's cases by id and its generalising marks, loaded once per search."""

    def __init__(self, paths=None):
        self.twins = {c.id: c for c in load(paths)}
        self.marks = marks(paths)

    def twin(self, case: Case) -> Case | None:
        twin = self.twins.get(case.id)
        return twin if twin is not None and twin.values == case.values else None

    def candidates(self, case: Case) -> list[Mark]:
        return [m for m in self.marks if m.admits(case)]
