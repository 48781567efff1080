"""Observations from every rank + the reference trajectories -> a list of checks (docs/checks.md). Expected
shard slices come from parity.observe.partition and sharded records are assembled here, never by the subject."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from parity.observe.dtypes import DTYPES
from parity.observe.partition import mesh_groups, shard_slice, split_sizes
from parity.observe.process_functions import TORCH_LINEAR
from parity.observe.records import STAGE, record_kind
from parity.settings import DEFAULT_REFERENCE_CACHE_SIZE
from parity.checks import rounding, stages
from parity.checks.bounded_cache import BoundedCache
from parity.checks.contract import contract_checks
from parity.checks.master_weights import master_weight_checks
from parity.checks.resume import check_trained_on, resume_checks
from parity.checks.one_thread import one_torch_thread
from parity.checks.tolerances import (ROUNDING_SAMPLES, clip_coefficient_error, judge_close, sgd_identity_bound,
                                      unit_roundoff)
from references.trajectory import Trajectory

@dataclass
class Check:
    name: str
    passed: bool
    step: int | None = None
    micro: int | None = None
    rank: int | None = None
    measured: float | None = None
    bound: float | None = None
    detail: str = ""

    @property
    def margin(self) -> float | None:
        return None if self.measured is None else self.bound - self.measured

    @property
    def ratio(self) -> float | None:
        if self.measured is None:
            return None
        return 0.0 if self.measured == 0 else (float("inf") if self.bound == 0 else self.measured / self.bound)

    def describe(self) -> str:
        where = " ".join(f"{k}={v}" for k, v in (("step", self.step), ("micro", self.micro), ("rank", self.rank))
                         if v is not None)
        text = f"{self.name}" + (f" [{where}]" if where else "")
        if self.measured is not None:
            text += f": measured {self.measured:.3e}, bound {self.bound:.3e}, margin {self.margin:.3e}"
        return text + (f" ({self.detail})" if self.detail else "")

    def as_dict(self) -> dict:
        return {"name": self.name, "step": self.step, "micro": self.micro, "rank": self.rank, "passed": self.passed,
                "measured": self.measured, "bound": self.bound, "margin": self.margin, "ratio": self.ratio,
                "detail": self.detail}


def _take(array: np.ndarray, dim: int | None, total: int, parts: int, index: int, grain: int = 1,
          split: str = "near_even") -> np.ndarray:
    if dim is None:
        return array
    index_tuple = [slice(None)] * array.ndim
    index_tuple[dim] = shard_slice(total, parts, index, grain, split)
    return array[tuple(index_tuple)]


class Comparison:
    def __init__(self, subject, values: dict, observations: dict, reference: Trajectory, oracle: Trajectory,
                 collectives: dict | None = None):
        self.subject, self.values = subject, values
        self.declared_collectives = collectives or {}  # case file's [matrix.collectives]
        self.obs = observations  # rank -> RankObservations
        self.reference, self.oracle = reference, oracle
        self.claims = subject.claims(values)
        self.train = subject.training_spec(values)
        self.dtype = values["dtype"]
        # The dtype the reference's stages compute in: under autocast the head's Linear runs in the autocast dtype
        # (docs/tolerances.md#stage-local-oracles).
        self.stage_dtype = values["dtype"] if values.optional("autocast", "off") == "off" else values["autocast"]
        self.tp = values.optional("tp", 1)
        self.grain = values.optional("grain", 1)
        self.split = self.claims.split
        self.checks: list[Check] = []
        self._sampled = None  # the rounding samples (parity/checks/rounding.py), taken when first needed

    def add(self, *args, **kwargs) -> None:
        self.checks.append(Check(*args, **kwargs))

    # -- numbers ---------------------------------------------------------------------------------
    def floor_dtype(self, kind: str, stage: bool = False):
        """The dtype a record's rounding floor is measured in (parity.checks.tolerances): its schema entry's rule."""
        return record_kind(kind, stage).floor_dtype(self.dtype, self.stage_dtype, self.reference.floor_dtypes)

    def rounding_samples(self):
        """The rounding samples' errors of every record (parity/checks/rounding.py), taken when first needed."""
        if self._sampled is None:
            self._sampled = rounding.cached_sampled_error(self.subject, self.values, self.oracle, ROUNDING_SAMPLES)
        return self._sampled

    def sampled_error(self, kind, step, micro, dp, name, view=None):
        """For close(): a lazy callable giving the rounding samples' error of this record through ``view`` (a rank's
        shard), or None where the reruns have no such record."""
        def seen(record):
            errors = record.numpy()
            return errors if view is None else np.stack([view(each) for each in errors])

        def get():
            record = self.rounding_samples().records.get((kind, step, micro, dp, name))
            return None if record is None else seen(record)

        def whole():
            """The samples' errors over the whole tensor and its max|oracle|, for a shard's gate (judge_close)."""
            record = self.rounding_samples().records.get((kind, step, micro, dp, name))
            exact = self.oracle.records.get((rounding.ORACLE_KIND.get(kind, kind), step, micro, dp, name))
            if record is None or exact is None:
                return None
            errors, exact = record.numpy(), exact.numpy()
            finite = np.isfinite(exact)
            return errors[:, finite], float(np.abs(exact[finite]).max(initial=0.0))

        def steps():
            """The samples' errors of this record at every step, through the same view (tolerances.dispersed)."""
            return [seen(record) for key, record in self.rounding_samples().records.items()
                    if (key[0], key[2], key[3], key[4]) == (kind, micro, dp, name)]
        if view is not None:
            get.whole = whole
        get.steps = steps
        return get

    def close(self, name, got, ref, oracle, sampled=None, shared=None, rounded_at=None, *, kind, stage=False,
              **where) -> None:
        """``kind``, ``stage``: the record's schema entry (parity/observe/records.py) gives the check's mode and
        floor dtype. ``shared``, ``rounded_at``: per entry of oracle, as judge_close takes them."""
        if got is None:
            self.add(name, False, detail="not observed", **where)
            return
        if got.shape != oracle.shape:
            self.add(name, False, detail=f"shape {got.shape} != expected {oracle.shape}", **where)
            return
        # torch's own 0/0 (an all-ignored mean) is nan in the oracle: nan exactly there, the bound elsewhere.
        expected_nan = np.isnan(oracle)
        if (np.isnan(got) != expected_nan).any():  # shapes are equal: array_equal's checks would be spent
            detail = (f"nan where unsharded torch gives a number ({int((np.isnan(got) & ~expected_nan).sum())}), "
                      f"a number where it gives nan ({int((~np.isnan(got) & expected_nan).sum())})")
            self.add(name, False, detail=detail, **where)
            return
        # An infinity (a logit masked to -inf) has no error to bound: the same infinity exactly where torch's is.
        expected_inf = np.isinf(oracle)
        wrong_inf = (expected_inf | np.isinf(got)) & (got != oracle)
        if wrong_inf.any():
            detail = (f"infinite where unsharded torch gives a number ({int((np.isinf(got) & ~expected_inf).sum())}), "
                      f"not torch's infinity ({int((expected_inf & (got != oracle)).sum())})")
            self.add(name, False, detail=detail, **where)
            return
        any_nan = bool(expected_nan.any())
        any_inf = bool(expected_inf.any())
        if any_nan or any_inf:
            keep = ~(expected_nan | expected_inf)
            got, ref, oracle = got[keep], ref[keep], oracle[keep]
            shared = None if shared is None else shared[keep]
            rounded_at = None if rounded_at is None else rounded_at[keep]
            if sampled is not None:
                tensor_gate = getattr(sampled, "whole", None)  # drops the oracle's nan itself
                trajectory = getattr(sampled, "steps", None)  # tolerances.dispersed drops each step's nan

                def sampled(whole=sampled, keep=keep):
                    errors = whole()
                    return None if errors is None or errors.shape[1:] != keep.shape else errors[:, keep]
                if tensor_gate is not None:
                    sampled.whole = tensor_gate
                if trajectory is not None:
                    sampled.steps = trajectory
        # A stage-local check's reference starts from the subject's own, exact, inputs to the stage.
        stage_local = record_kind(kind, stage).mode == STAGE or self.claims.stage_local
        shared_rms = 0.0 if shared is None or not shared.size else float(np.sqrt(np.mean(np.square(shared))))
        judged = judge_close(got, ref, oracle, self.floor_dtype(kind, stage), sampled, inherits=not stage_local,
                             shared_rms=shared_rms, rounded_at=rounded_at)
        finite = bool(np.isfinite(got).all())
        detail = judged.describe() if finite else "non-finite values"
        if any_nan:
            detail += f"; {int(expected_nan.sum())} nan as in torch"
        if any_inf:
            detail += f"; {int(expected_inf.sum())} infinite as in torch"
        self.add(name, finite and judged.passed, measured=judged.measured, bound=judged.bound, detail=detail, **where)

    def expected(self, key, view=None):
        """The reference's and the oracle's record ``key`` (kind, step, micro, dp, name), seen through ``view``."""
        ref, orc = (which.get(*key).numpy() for which in (self.reference, self.oracle))
        return (ref, orc) if view is None else (view(ref), view(orc))

    def close_record(self, name, got, key, view=None, **where):
        """close() of ``got`` against record ``key`` (expected), with that record's rounding samples; returns the
        (reference, oracle) it was held to."""
        ref, orc = self.expected(key, view)
        self.close(name, got, ref, orc, self.sampled_error(*key, view), kind=key[0], **where)
        return ref, orc

    def exact(self, name, got, want, **where) -> None:
        if got is None or got.shape != want.shape:
            self.add(name, False, detail="not observed" if got is None else f"shape {got.shape} != {want.shape}",
                     **where)
            return
        diff = (got != want) & ~(np.isnan(got) & np.isnan(want))  # nan matches nan (torch's 0/0 kept)
        detail = ""
        if diff.any():
            first = tuple(int(i) for i in np.argwhere(diff)[0])
            detail = f"{int(diff.sum())} of {diff.size} differ; first at {first}: {got[first]!r} vs {want[first]!r}"
        measured = float(np.max(np.abs(np.where(diff, got - want, 0.0)))) if got.size else 0.0
        self.add(name, not diff.any(), measured=measured, bound=0.0, detail=detail, **where)

    # -- the checks ----------------------------------------------------------------------------
    def run(self) -> list[Check]:
        self.check_structure()  # first: a wrong build fails by name before any number is compared
        self.check_claims()
        self.check_initial_weights()
        for step in range(self.train.steps):
            for micro in range(self.train.micro_batches):
                self.check_micro(step, micro)
                self.check_collectives(step, micro)
            self.check_step(step)
        self.check_skips()
        self.check_stages()
        self.check_lookup_loss_stage()
        self.check_replicas_agree()
        self.check_saved()
        check_trained_on(self)
        for check in resume_checks(self) + master_weight_checks(self) + contract_checks(self.obs, self.reference):
            self.add(**check)  # the optimizer's float32 masters; precision and placement of every tensor
        return self.checks

    # -- structure (docs/subjects.md#structure-checks) ------------------------------------------
    def check_structure(self) -> None:
        """What each rank built before its first forward (facts["structure"]) against the claims and the
        partition formula, where the subject records structure (docs/subjects.md#structure-checks)."""
        if not any("structure" in o.facts for o in self.obs.values()):
            return
        for rank, o in sorted(self.obs.items()):
            built = o.facts.get("structure")
            if built is None:
                self.add("structure", False, rank=rank, detail="not recorded")
                continue
            if "params" in built:
                for name, dim in self.claims.param_shards.items():
                    self.check_param_structure(name, dim, rank, o, built["params"].get(name))
            for path, layer in built.get("modules", {}).items():
                self.check_layer_structure(path, layer, rank, o)

    def group_shapes(self, name: str, dp: int) -> list | None:
        """The local shapes of ``name`` on the ranks of one TP group, in TP order (None where one is missing)."""
        shapes = [o.facts.get("structure", {}).get("params", {}).get(name, {}).get("shape")
                  for o in sorted((o for o in self.obs.values() if o.dp_rank == dp), key=lambda o: o.tp_rank)]
        return None if any(s is None for s in shapes) else shapes

    def check_param_structure(self, name, dim, rank, o, found) -> None:
        key = ("weight", -1, None, None, name)
        if key not in self.reference.records:
            return  # not a parameter of the reference: nothing to hold its shape to
        full = tuple(self.reference.records[key].shape)
        check = f"structure[{name}]"
        if found is None:
            self.add(check, False, rank=rank, detail="not recorded: the rank trains no such parameter")
            return
        got = tuple(found["shape"])
        placed = f", placements {found['placements']}" if "placements" in found else ""
        if dim is None:
            self.add(check, got == full, rank=rank,
                     detail=f"replicated {full} as claimed{placed}" if got == full else
                     f"expected replicated {full}, built {got}{placed}")
            return
        axis = dim % len(full)
        if name in self.claims.param_layout:
            ranges = self.claims.param_layout[name][o.tp_rank]
            want = full[:axis] + (sum(b - a for a, b in ranges),) + full[axis + 1:]
            expected = f"{ranges} of {full[axis]} along dim {dim} (the claimed layout in {self.tp})"
        else:
            part = shard_slice(full[axis], self.tp, o.tp_rank, self.grain, self.split)
            want = full[:axis] + (part.stop - part.start,) + full[axis + 1:]
            expected = f"[{part.start}, {part.stop}) of {full[axis]} along dim {dim} ({self.split} in {self.tp})"
        if got == want:
            self.add(check, True, rank=rank, detail=f"built {got}: {expected}{placed}")
            return
        if got == full and self.tp > 1:
            self.add(check, False, rank=rank, detail=f"expected sharded along dim {dim} in {self.tp}: {expected}; "
                                                     f"found replicated {got}{placed}")
            return
        shapes = self.group_shapes(name, o.dp_rank)
        where = ""
        if shapes is not None and len(got) == len(full) and all(len(s) == len(full) for s in shapes):
            start = sum(s[axis] for s in shapes[:o.tp_rank])
            where = f" = [{start}, {start + got[axis]}) of {full[axis]} as its TP group's shards lie"
        self.add(check, False, rank=rank, detail=f"built {got}{where}; expected {want}: {expected}{placed}")

    def check_layer_structure(self, path, layer, rank, o) -> None:
        """A sharded layer's own partition facts, where it exposes them."""
        if "vocab_start_index" in layer and "vocab_end_index" in layer:
            part = shard_slice(self.values["vocab"], self.tp, o.tp_rank, self.grain, self.split)
            got = (layer["vocab_start_index"], layer["vocab_end_index"])
            self.add(f"structure[{path}.vocab_range]", got == (part.start, part.stop), rank=rank,
                     detail=f"{layer['class']} holds vocab [{got[0]}, {got[1]}), formula "
                            f"[{part.start}, {part.stop}) of {self.values['vocab']} in {self.tp}")
        if "tp_world_size" in layer and "tp_index" in layer:
            got = (layer["tp_world_size"], layer["tp_index"])
            self.add(f"structure[{path}.tp_index]", got == (self.tp, o.tp_rank), rank=rank,
                     detail=f"{layer['class']} holds index {got[1]} of {got[0]}, formula {o.tp_rank} of {self.tp}")
        if "gather_output" in layer and "logits" in self.claims.micro_records and path == self.head_path():
            whole = self.claims.micro_records["logits"] is None
            self.add(f"structure[{path}.gather_output]", layer["gather_output"] == whole, rank=rank,
                     detail=f"{layer['class']} gather_output={layer['gather_output']}; the claims give each rank "
                            + ("the whole logits" if whole else "its vocab block of the logits"))

    def head_path(self) -> str:
        return self.values.optional("head", "lm_head")

    def check_claims(self) -> None:
        for rank, o in sorted(self.obs.items()):
            found = o.facts.get("module_types", {})
            for path, want in self.claims.module_types.items():
                self.add(f"module_type[{path}]", found.get(path) == want, rank=rank,
                         detail=f"claimed {want}, found {found.get(path)}")
            shared = o.facts.get("shared_params", {})
            for a, b in self.claims.shared_params:
                found_shared = shared.get(f"{a}={b}")
                self.add(f"shared_param[{a}={b}]", found_shared is True, rank=rank,
                         detail="one Parameter" if found_shared else
                         ("not observed" if found_shared is None else "two different Parameters: the tie is broken"))
            linear = o.facts.get("functional_linear")
            if linear is not None:  # what the case's model ran (parity/observe/process_functions.py)
                self.add("functional_linear", linear == TORCH_LINEAR, rank=rank,
                         detail=f"the model ran {linear}; an untouched process has {TORCH_LINEAR}")
            state = o.facts.get("state_at_start")
            self.add("process_state_reset", state == self.subject.clean_state, rank=rank,
                     detail=f"found {state}, expected {self.subject.clean_state}")
            if self.claims.loss_backend is not None:
                ran = o.facts.get("loss_backend", {})
                wrong = {k: v for k, v in ran.items() if v != [self.claims.loss_backend]}
                self.add("loss_backend", bool(ran) and not wrong and
                         len(ran) == self.train.steps * self.train.micro_batches, rank=rank,
                         detail=f"expected one '{self.claims.loss_backend}' CE call per micro-batch; "
                                f"{len(ran)} micro-batches seen, unexpected: {dict(list(wrong.items())[:3])}")
            if self.claims.gemm_dtype is not None:
                ran = o.facts.get("gemm_dtypes")
                self.add("gemm_dtype", ran == [self.claims.gemm_dtype], rank=rank,
                         detail=f"expected every matrix product in {self.claims.gemm_dtype}; ran: {ran}")
            if self.claims.collective_path is not None:
                ran = o.facts.get("collective_path")
                self.add("collective_path", ran == [self.claims.collective_path], rank=rank,
                         detail=f"expected the one collective through {self.claims.collective_path}; ran: {ran}")
        if self.claims.loss_backend is not None:
            self.check_backend_agreement()
        if self.subject.records_rank_decisions:
            self.check_rank_decisions()

    def check_rank_decisions(self) -> None:
        """What the framework decided on each rank alone must be the suite's formula for that rank, and every
        member of a group must list the same members, even where the numbers agree (docs/checks.md)."""
        world = len(self.obs)
        for rank, o in sorted(self.obs.items()):
            found = o.facts.get("rank_decisions")
            if found is None:
                self.add("rank_decisions", False, rank=rank, detail="not recorded")
                continue
            want = {**mesh_groups(rank, world, self.tp), "engine_dp_world": world // self.tp,
                    **self.subject.decided(self.values)}
            if "head_vocab_range" in found:
                part = shard_slice(self.values["vocab"], self.tp, want["tp_rank"], self.grain, self.split)
                want["head_vocab_range"] = [part.start, part.stop]
            wrong = {k: f"{found.get(k)} (formula {v})" for k, v in want.items() if found.get(k) != v}
            self.add("rank_decisions", not wrong, rank=rank,
                     detail=f"differs from the suite's formula: {wrong}" if wrong else f"as the formula: {found}")
        for key in getattr(self.subject, "agreed_decisions", ()):
            views = {r: o.facts.get("rank_decisions", {}).get(key) for r, o in sorted(self.obs.items())}
            if all(v is None for v in views.values()):
                continue  # a decision this case does not make (fp16 dynamic scaling off)
            distinct = {repr(v) for v in views.values()}
            self.add(f"rank_decisions_agree[{key}]", len(distinct) == 1,
                     detail=f"every rank: {next(iter(views.values()))}" if len(distinct) == 1 else
                     "ranks disagree: " + "; ".join(f"rank {r}: {v}" for r, v in views.items()))
        for key in ("tp_group", "dp_group"):
            views = {r: o.facts.get("rank_decisions", {}).get(key) for r, o in self.obs.items()}
            # a member that recorded nothing already failed rank_decisions; compare those that did
            split = {r: (v, views.get(m)) for r, v in views.items() if v for m in v
                     if views.get(m) is not None and views.get(m) != v}
            self.add(f"rank_decisions_agree[{key}]", not split,
                     detail="every member lists the same group" if not split else
                     f"members disagree: rank {next(iter(split))} lists {next(iter(split.values()))[0]}, "
                     f"a member of it lists {next(iter(split.values()))[1]}")

    def check_backend_agreement(self) -> None:
        """The ranks of one TP group ran the same CE on every micro-batch: DeepSpeed's Liger gate is decided per
        rank, and ranks that mix backends do not hang (docs/checks.md#how-the-comparison-works)."""
        for dp in sorted({o.dp_rank for o in self.obs.values()}):
            group = {o.tp_rank: o.facts.get("loss_backend", {}) for o in self.obs.values() if o.dp_rank == dp}
            keys = sorted({k for ran in group.values() for k in ran})
            split = {k: {r: group[r].get(k) for r in sorted(group)} for k in keys
                     if len({tuple(group[r].get(k) or ()) for r in group}) > 1}
            self.add("loss_backend_agree", not split,
                     detail="every TP rank ran the same CE on every micro-batch" if not split else
                     f"TP ranks (dp {dp}) ran different CEs on {len(split)} micro-batches, first "
                     f"{next(iter(split))}: {next(iter(split.values()))}")

    def check_collectives(self, step: int, micro: int) -> None:
        """Exact collective counts per rank and micro-batch, where the case file declares them: a
        dropped or extra collective fails even when the numbers agree (parity/observe/collectives.py)."""
        if not self.declared_collectives:
            return
        from parity.observe.collectives import expected_counts

        want = expected_counts(self.declared_collectives, self.tp, first=(step, micro) == (0, 0))
        for rank, o in sorted(self.obs.items()):
            seen = o.facts.get("collectives", {}).get((step, micro))
            if seen is None:
                self.add("collectives", False, step=step, micro=micro, rank=rank, detail="not observed")
                continue
            got = {k: v for k, v in seen.items() if v}
            diff = {k: f"{got.get(k, 0)} (declared {want.get(k, 0)})" for k in sorted(set(got) | set(want))
                    if got.get(k, 0) != want.get(k, 0)}
            self.add("collectives", not diff, step=step, micro=micro, rank=rank,
                     detail=f"issued {got}" if not diff else f"differs: {diff}; issued {got}, declared {want}")

    def _param_view(self, name, array, rank):
        """``rank``'s shard of ``array``, a whole parameter (or its gradient) of the reference's shape."""
        dim = self.claims.param_shards.get(name)
        if dim is not None and name in self.claims.param_layout:
            ranges = self.claims.param_layout[name][self.obs[rank].tp_rank]
            return np.concatenate([np.take(array, np.arange(a, b), axis=dim) for a, b in ranges], axis=dim)
        total = self.reference.get("weight", -1, None, None, name).shape[dim] if dim is not None else 0
        return _take(array, dim, total, self.tp, self.obs[rank].tp_rank, self.grain, self.split)

    def _record_view(self, which: Trajectory, kind, step, name, rank):
        """``rank``'s shard of a per-parameter record (weight, grad, master_weight) of ``which``."""
        return self._param_view(name, which.get(kind, step, None, None, name).numpy(), rank)

    def initial_names(self) -> list:
        """The reference's parameters, by their initial weights."""
        return [k[4] for k in self.reference.records if k[0] == "weight" and k[1] == -1]

    def group_blocks(self, kind, step, micro, name, dp) -> list:
        """One record of the TP group of data-parallel index ``dp``, each rank's, in TP order (None: not recorded)."""
        return [b for _, b in sorted((o.tp_rank, o.get(kind, step, micro, name))
                                     for o in self.obs.values() if o.dp_rank == dp)]

    def check_initial_weights(self) -> None:
        # No arithmetic separates a shard from the reference's slice: demand equality.
        for rank, o in sorted(self.obs.items()):
            for name in self.initial_names():
                want = self._record_view(self.reference, "weight", -1, name, rank)
                self.exact(f"initial_weight[{name}]", o.get("weight", -1, None, name), want, rank=rank)

    def check_micro(self, step: int, micro: int) -> None:
        for rank, o in sorted(self.obs.items()):
            dp = o.dp_rank
            for kind, dim in self.claims.micro_records.items():
                key = (kind, step, micro, dp, None)
                got = o.get(kind, step, micro, None)
                view = None
                if dim is not None:
                    total = self.oracle.get(*key).shape[dim]
                    want_width = split_sizes(total, self.tp, self.grain, self.split)[o.tp_rank]
                    width = None if got is None else got.shape[dim]
                    self.add(f"shard_width[{kind}]", width == want_width, step=step, micro=micro, rank=rank,
                             detail=f"local width {width}, partition formula says {want_width} of {total}")

                    def view(a, dim=dim, total=total, tp_rank=o.tp_rank):
                        return _take(a, dim % a.ndim, total, self.tp, tp_rank, self.grain, self.split)
                if kind in self.claims.exact_records:
                    self.exact(kind, got, self.expected(key, view)[0], step=step, micro=micro, rank=rank)
                else:
                    self.close_record(kind, got, key, view, step=step, micro=micro, rank=rank)
                if dim is not None and o.tp_rank == 0:
                    self.check_assembled(kind, dim, step, micro, dp)

    # -- stage-local oracles (parity/checks/stages.py) -------------------------------------------
    def assembled(self, kind, step, micro, dp):
        """A micro-batch record of one TP group, whole: a rank's own copy, or the blocks concatenated."""
        dim = self.claims.micro_records.get(kind)
        blocks = self.group_blocks(kind, step, micro, None, dp)
        if not blocks or any(b is None for b in blocks):
            return None
        if dim is None:
            return blocks[0]
        try:
            return np.concatenate(blocks, axis=dim)
        except ValueError:
            return None

    def head_weight_name(self) -> str | None:
        """The head's weight among the reference's parameters: ``<head>.weight``, or the embedding it is tied to."""
        spec = self.subject.model_spec(self.values)
        names = self.initial_names()
        found = [n for n in names if n == f"{spec.head_name}.weight" or n.endswith(f".{spec.head_name}.weight")]
        if not found and spec.tied:
            found = [n for n in names if n.endswith("embed_tokens.weight")]
        return found[0] if len(found) == 1 else None

    def assembled_weight(self, name, step, dp):
        """A parameter after update ``step`` (-1: initial) as the TP group holds it, whole."""
        dim = self.claims.param_shards.get(name)
        blocks = self.group_blocks("weight", step, None, name, dp)
        if not blocks or any(b is None for b in blocks):
            return None
        return blocks[0] if dim is None else np.concatenate(blocks, axis=dim)

    def check_stages(self) -> None:
        """Loss and head-input gradient re-evaluated on the subject's own logits (and head weight), for training
        subjects that record both (docs/tolerances.md#stage-local-oracles)."""
        if not {"logits", "loss"} <= set(self.claims.micro_records) or self.claims.micro_records.get("loss") is not None:
            return
        if ("logits", 0, 0, 0, None) not in self.reference.records:
            return
        from references.trajectory import step_num_items

        spec = self.subject.model_spec(self.values)
        weight_name = (self.head_weight_name() if "head_input_grad" in self.claims.micro_records
                       and self.claims.logits_from_head else None)
        where, logits, labels, weights, num_items = [], [], [], [], []
        for step in range(self.train.steps):
            for dp in sorted({o.dp_rank for o in self.obs.values()}):
                batches = self.train.batches(step, dp, spec.vocab, spec.ignore_index)
                weight = None if weight_name is None else self.assembled_weight(weight_name, step - 1, dp)
                for micro in range(self.train.micro_batches):
                    z = self.assembled("logits", step, micro, dp)
                    if z is None or z.shape != self.oracle.get("logits", step, micro, dp, None).shape:
                        continue  # the end-to-end logits checks have failed already
                    where.append((step, micro, dp))
                    logits.append(z)
                    labels.append(batches[micro]["labels"])
                    weights.append(weight)
                    # num_items_in_batch as the user's trainer passes it (the trajectory's own rule).
                    num_items.append(step_num_items(self.train, step, spec.vocab, spec.ignore_index))
        if not where:
            return
        hidden = self.oracle.get("head_input_grad", 0, 0, 0, None).shape[-1] if weight_name else None
        if any(w is None or w.shape != (logits[0].shape[-1], hidden) for w in weights):
            weights = None
        args = (logits, labels, weights, num_items, spec, self.train)
        ref_loss, ref_hgrad, ref_dz = stages.losses_and_head_input_grads(*args, DTYPES[self.stage_dtype])
        orc_loss, orc_hgrad, orc_dz = stages.losses_and_head_input_grads(*args, torch.float64)
        if weights is not None:
            self.check_logits_stage(where, weights, weight_name)
            sampled_dz = {}

            def noisy_dz(seed):  # one rounding sample of the CE stage, taken on a miss, once per case
                if seed not in sampled_dz:
                    sampled_dz[seed] = stages.sampled_logits_grads(logits, labels, num_items, spec, self.train,
                                                                   DTYPES[self.stage_dtype], seed)
                return sampled_dz[seed]
            # A tied weight's gradient is the head's alone on the rows no token of the step looked up.
            rows = self.rows_not_looked_up(spec) if spec.tied else None
            self.check_head_grad_stage(where, logits, ref_dz, orc_dz, weight_name, noisy_dz, rows)
        # A vocabulary-sharded head rounds each shard's dz W partial product
        # (docs/tolerances.md#a-sharded-heads-partial-products).
        products = None
        if weights is not None and self.tp > 1 and self.claims.param_shards.get(weight_name) == 0:
            parts = [shard_slice(weights[0].shape[0], self.tp, r, self.grain, self.split) for r in range(self.tp)]
            products = [stages.partial_products_magnitude(dz, w, parts) for dz, w in zip(orc_dz, weights)]
        for i, (step, micro, dp) in enumerate(where):
            for rank, o in sorted(self.obs.items()):
                if o.dp_rank != dp:
                    continue
                self.close("loss[stage]", o.get("loss", step, micro, None), ref_loss[i], orc_loss[i], kind="loss",
                           stage=True, step=step, micro=micro, rank=rank)
                got = o.get("head_input_grad", step, micro, None)
                if orc_hgrad[i] is not None and got is not None and got.size == orc_hgrad[i].size:
                    partials = products[i] if products else None
                    self.close("head_input_grad[stage]", got, ref_hgrad[i].reshape(got.shape),
                               orc_hgrad[i].reshape(got.shape), kind="head_input_grad", stage=True, step=step,
                               micro=micro, rank=rank,
                               rounded_at=None if partials is None else partials.reshape(got.shape))

    def check_lookup_loss_stage(self) -> None:
        """loss[stage] of an embedding trained alone: the squared-error loss from the subject's own recorded
        lookup, at the case dtype and in float64 (docs/tolerances.md#stage-local-oracles)."""
        if set(self.claims.micro_records) != {"embedding", "loss"}:
            return
        from references.embedding_lookup import lookup_batch

        for step in range(self.train.steps):
            for micro in range(self.train.micro_batches):
                _, target = lookup_batch(self.train, step, micro, self.values["vocab"], self.values["hidden"])
                for rank, o in sorted(self.obs.items()):
                    out = o.get("embedding", step, micro, None)
                    if out is None or out.shape != tuple(target.shape):
                        continue  # the end-to-end embedding check has failed it already
                    ref = stages.lookup_loss_from_lookup(out, target, DTYPES[self.dtype])
                    orc = stages.lookup_loss_from_lookup(out, target, torch.float64)
                    self.close("loss[stage]", o.get("loss", step, micro, None), ref, orc, kind="loss", stage=True,
                               step=step, micro=micro, rank=rank)

    def head_bias_name(self, weight_name: str) -> str | None:
        """The head's own bias: beside its weight, or under the head's name when the weight is a tied embedding's."""
        head = self.subject.model_spec(self.values).head_name
        names = self.initial_names()
        for name in (weight_name[:-len("weight")] + "bias", f"{head}.bias"):
            found = [n for n in names if n == name or n.endswith(f".{name}")]
            if len(found) == 1:
                return found[0]
        return None

    def stage_sliceable(self, weight_name: str) -> bool:
        """The logits and head-gradient stages model one matmul per element: a head sharded along the
        vocabulary (or replicated). A row-parallel head sums partial products across ranks: not this stage."""
        return self.claims.param_shards.get(weight_name) in (0, None)

    def check_logits_stage(self, where, weights, weight_name) -> None:
        """logits[stage]: each rank's logits against F.linear of its own recorded head input with the
        weight (and bias) it ran with, at the case dtype and in float64."""
        if not self.stage_sliceable(weight_name):
            return

        bias_name = self.head_bias_name(weight_name)
        dim = self.claims.micro_records.get("logits")
        for i, (step, micro, dp) in enumerate(where):
            bias = None if bias_name is None else self.assembled_weight(bias_name, step - 1, dp)
            shape = self.oracle.get("logits", step, micro, dp, None).shape
            for rank, o in sorted(self.obs.items()):
                if o.dp_rank != dp:
                    continue
                x = o.get("head_input", step, micro, None)
                if x is None or x.shape[-1] != weights[i].shape[-1]:
                    self.add("logits[stage]", False, step=step, micro=micro, rank=rank,
                             detail="head input not observed" if x is None else f"head input of shape {x.shape}")
                    continue
                ref = stages.logits_from_head_input(x, weights[i], bias, DTYPES[self.stage_dtype]).reshape(shape)
                orc = stages.logits_from_head_input(x, weights[i], bias, torch.float64).reshape(shape)
                # x @ w.T rounded before the bias is added is plain PyTorch too
                # (docs/tolerances.md#a-biased-heads-product): the product is a value such an evaluation rounds.
                product = (None if bias is None else
                           stages.logits_from_head_input(x, weights[i], None, torch.float64).reshape(shape))
                if dim is not None:
                    total = shape[dim]
                    ref, orc, product = (None if t is None else
                                         _take(t, dim % t.ndim, total, self.tp, o.tp_rank, self.grain, self.split)
                                         for t in (ref, orc, product))
                self.close("logits[stage]", o.get("logits", step, micro, None), ref, orc, rounded_at=product,
                           kind="logits", stage=True, step=step, micro=micro, rank=rank)

    def rows_not_looked_up(self, spec) -> dict:
        """step -> [V] bool: the vocabulary rows no micro-batch of the step (data-parallel rank 0) looks up."""
        rows = {}
        for step in range(self.train.steps):
            seen = np.zeros(spec.vocab, dtype=bool)
            for batch in self.train.batches(step, 0, spec.vocab, spec.ignore_index):
                seen[batch["input_ids"].reshape(-1).numpy()] = True
            rows[step] = ~seen
        return rows

    def check_head_grad_stage(self, where, logits, ref_dz, orc_dz, weight_name, noisy_dz, weight_rows=None) -> None:
        """grad[<head weight and bias>][stage]: each rank's head-shard step gradient against sum dz^T x, one DP rank
        only; ``weight_rows`` (tied: step -> [V] bool) limits the weight's rows; ``logits``: the CE stage's inputs
        (docs/tolerances.md#stage-local-oracles)."""
        u = unit_roundoff("fp32")  # the CE computes in float32 whatever the case dtype
        if not self.stage_sliceable(weight_name) or {o.dp_rank for o in self.obs.values()} != {0}:
            return
        if self.train.comm_dtype is not None:
            return  # a compressed gradient reduction is a further stage (docs/tolerances.md#stage-local-oracles)

        bias_name = self.head_bias_name(weight_name)
        noisy_samples: dict = {}

        def noisy_grads(items, xs, seed):
            """One rounding sample of the step's (weight, bias) gradient, once per case for its inputs
            (docs/tolerances.md#stage-local-oracles)."""
            key = (tuple(i for _, i in items), seed, tuple((x.shape, x.dtype.str, x.tobytes()) for x in xs))
            if key not in noisy_samples:
                dzs = noisy_dz(seed)
                noisy_samples[key] = stages.sampled_head_param_grads([dzs[i] for _, i in items], xs,
                                                                     DTYPES[self.stage_dtype], bias_name is not None,
                                                                     seed)
            return noisy_samples[key]

        by_step: dict = {}
        for i, (step, micro, _) in enumerate(where):
            by_step.setdefault(step, []).append((micro, i))
        skipped = self.reference_skipped()
        for step, items in sorted(by_step.items()):
            if [m for m, _ in items] != list(range(self.train.micro_batches)):
                continue  # a micro-batch's logits failed end to end: the step's sum is not this stage's
            if step in skipped:
                continue  # its gradient holds the overflow's inf; check_skipped_step holds the step
            shares = [stages.shared_rounding_weights(logits[i], orc_dz[i], u) for _, i in items]  # every rank's
            for rank, o in sorted(self.obs.items()):
                xs = [o.get("head_input", step, m, None) for m, _ in items]
                if any(x is None for x in xs):
                    continue  # logits[stage] failed it as not observed
                ref_w, ref_b = stages.head_param_grads([ref_dz[i] for _, i in items], xs, DTYPES[self.stage_dtype],
                                                       bias_name is not None)
                orc_w, orc_b = stages.head_param_grads([orc_dz[i] for _, i in items], xs, torch.float64,
                                                       bias_name is not None)
                shared_w, shared_b = stages.head_grad_shared_rms(shares, xs, bias_name is not None)
                for index, (name, ref, orc, shared) in enumerate(((weight_name, ref_w, orc_w, shared_w),
                                                                  (bias_name, ref_b, orc_b, shared_b))):
                    if name is None:
                        continue
                    orc_view = self._param_view(name, orc, rank)
                    shared_view = self._param_view(name, shared, rank)

                    # The stage's own rounding samples, for a small or cancelling tensor that misses.
                    def sampled(items=items, xs=xs, index=index, name=name, rank=rank, orc_view=orc_view):
                        errors = []
                        for seed in range(ROUNDING_SAMPLES):
                            noisy = noisy_grads(items, xs, seed)[index]
                            errors.append(np.abs(self._param_view(name, noisy, rank) - orc_view))
                        return np.stack(errors)
                    got, ref_view = o.get("grad", step, None, name), self._param_view(name, ref, rank)
                    if index == 0 and weight_rows is not None:
                        keep = self._param_view(name, weight_rows[step], rank)
                        if got is None or got.shape != orc_view.shape or not keep.any():
                            continue  # the end-to-end grad check judges a missing or misshapen one
                        got, ref_view, orc_view = got[keep], ref_view[keep], orc_view[keep]
                        shared_view = shared_view[keep]

                        def sampled(whole=sampled, keep=keep):
                            errors = whole()
                            return errors[:, keep]
                    self.close(f"grad[{name}][stage]", got, ref_view, orc_view, sampled=sampled, shared=shared_view,
                               kind="grad", stage=True, step=step, rank=rank)

    def check_assembled(self, kind, dim, step, micro, dp) -> None:
        """Concatenate the TP group's blocks in rank order: the harness, not the subject, assembles."""
        blocks = self.group_blocks(kind, step, micro, None, dp)
        if any(b is None for b in blocks) or len(blocks) != self.tp:
            self.add(f"assembled[{kind}]", False, step=step, micro=micro, detail="missing rank blocks")
            return
        try:
            assembled = np.concatenate(blocks, axis=dim)
        except ValueError as exc:
            self.add(f"assembled[{kind}]", False, step=step, micro=micro, detail=str(exc))
            return
        self.close_record(f"assembled[{kind}]", assembled, (kind, step, micro, dp, None), step=step, micro=micro)

    def reference_skipped(self) -> set:
        """The steps plain torch's GradScaler skipped in the reference (references/grad_scaler.py): an empty set
        without dynamic loss scaling."""
        return {key[1] for key, value in self.reference.records.items()
                if key[0] == "step_skipped" and float(value) == 1.0}

    def check_skipped_step(self, step: int) -> None:
        """A step the reference skipped for an inf or nan gradient: every weight bitwise what it was before it,
        as torch's skipped optimizer.step() leaves it (docs/checks.md)."""
        names = [k[4] for k in self.reference.records if k[0] == "grad" and k[1] == step]
        for rank, o in sorted(self.obs.items()):
            for name in names:
                self.exact(f"weight_unchanged[{name}]", o.get("weight", step, None, name),
                           o.get("weight", step - 1, None, name), step=step, rank=rank)

    def check_skips(self) -> None:
        """Dynamic loss scaling: the steps each rank's optimizer skipped (rank_decisions "skipped") must be the
        steps plain torch's GradScaler skipped on the same model and data."""
        if not any(k[0] == "step_skipped" for k in self.reference.records):
            return
        want = sorted(self.reference_skipped())
        for rank, o in sorted(self.obs.items()):
            got = o.facts.get("rank_decisions", {}).get("skipped")
            self.add("skipped_as_torch", got == want, rank=rank,
                     detail=f"rank skipped steps {got}, torch's GradScaler {want}")

    def check_step(self, step: int) -> None:
        if step in self.reference_skipped():
            self.check_skipped_step(step)
            return
        lr = self.train.lr
        names = [k[4] for k in self.reference.records if k[0] == "grad" and k[1] == step]
        observed = self.observed_grad_norm(step, names) if self.train.clip > 0 else None
        coefficient_error = clip_coefficient_error(self.claims.reports_grad_norm, observed[1]) if observed else 0.0
        for rank, o in sorted(self.obs.items()):
            for name in names:
                def view(a, name=name, rank=rank):
                    return self._param_view(name, a, rank)
                got_g = o.get("grad", step, None, name)
                ref_g, orc_g = self.close_record(f"grad[{name}]", got_g, ("grad", step, None, None, name), view,
                                                 step=step, rank=rank)
                # Nonzero wherever the oracle's is: a subject that computes nothing cannot pass on matching zeros.
                oracle_moves = bool((orc_g != 0).any())
                if got_g is not None:
                    moves = bool((got_g != 0).any())
                    # All zeros pass where zero passes the grad bound (docs/tolerances.md#nonzero-gradients).
                    unresolved = (oracle_moves and not moves and got_g.shape == orc_g.shape
                                  and judge_close(np.zeros_like(orc_g), ref_g, orc_g, self.floor_dtype("grad")).passed)
                    self.add(f"grad_nonzero[{name}]", moves == oracle_moves or unresolved, step=step, rank=rank,
                             detail=("gradient all zeros, within its bound of the oracle's" if unresolved else
                                     f"gradient {'all zeros' if oracle_moves else 'nonzero'}, "
                                     f"oracle's {'nonzero' if oracle_moves else 'all zeros'}"))
                got_w = o.get("weight", step, None, name)
                self.close_record(f"weight[{name}]", got_w, ("weight", step, None, None, name), view, step=step,
                                  rank=rank)
                prev = o.get("weight", step - 1, None, name)
                if got_w is None or prev is None or got_g is None or not got_w.shape == prev.shape == got_g.shape:
                    continue  # already failed above, as not observed or of the wrong shape
                self.check_weight_moved(name, got_w, prev, oracle_moves, step, rank)
                self.check_sgd_identity(name, prev, got_g * self.clip_coefficient(o, step, observed), got_w, lr,
                                        step, rank,
                                        clipped=self.train.clip > 0, coefficient_error=coefficient_error)
            if self.claims.reports_grad_norm:
                self.close_record("grad_norm", o.get("grad_norm", step, None, None),
                                  ("grad_norm", step, None, None, None), step=step, rank=rank)

    def check_weight_moved(self, name, got_w, prev, oracle_moves, step, rank) -> None:
        """A weight moves when the gradient is nonzero and stays put when it is zero, up to a rounding-midpoint
        crossing of its master (docs/tolerances.md#weight-movement-and-rounding-midpoints)."""
        moved = bool((got_w != prev).any())
        ref_now = self._record_view(self.reference, "weight", step, name, rank)
        ref_before = self._record_view(self.reference, "weight", step - 1, name, rank)
        if not oracle_moves:
            self.add(f"weight_changed[{name}]", not moved, step=step, rank=rank,
                     detail="weight moved on a step with no gradient")
        elif bool(np.any(ref_now != ref_before)):
            ref_moved = ref_now != ref_before
            after = self.obs[rank].get("weight", step + 1, None, name)
            # a misshapen shard failed weight[...] already: only its moving can meet the step
            same_shape = got_w.shape == ref_now.shape
            early = same_shape and bool(np.any((got_w == ref_now) & ref_moved))
            late = False
            if same_shape and after is not None and after.shape == ref_now.shape:
                # moves the reference's way next step and catches up with it (a skipped update does not)
                ref_next = self._record_view(self.reference, "weight", step + 1, name, rank)
                late = bool(np.any((np.sign(after - got_w) == np.sign(ref_now - ref_before)) & (after == ref_next)
                                   & ref_moved))
            crossing = early or late or (after is None and self.only_crossings(name, ref_moved, step, rank))
            master = not (moved or crossing) and self.master_moved(name, step, rank)
            met = moved or crossing or master
            self.add(f"weight_changed[{name}]", met, step=step, rank=rank,
                     detail="" if moved else "optimizer step left the weight unchanged"
                     + ("; it holds the reference's new value a step early or late (a rounding midpoint)"
                        if crossing else "") + ("; its float32 master moved (no rounding midpoint crossed yet)"
                                                if master else ""))

    def master_moved(self, name, step, rank) -> bool:
        """bf16/fp16 with a recorded float32 master: did this step update the master?
        (docs/tolerances.md#weight-movement-and-rounding-midpoints)."""
        o = self.obs[rank]
        now = o.get("master_weight", step, None, name)
        before = o.get("master_weight", step - 1, None, name) if step > 0 else o.get("weight", -1, None, name)
        return now is not None and before is not None and now.shape == before.shape and bool(np.any(now != before))

    def only_crossings(self, name, ref_moved, step, rank) -> bool:
        """bf16/fp16: did every entry the reference moved this step move by a rounding-midpoint crossing (its
        master moving less than the weight jumped)? Only such a move can come a step late."""
        if ("master_weight", step, None, None, name) not in self.reference.records:
            return False

        def ref(kind, at):
            if at < 0:
                kind = "weight"  # the master starts as the initial weight
            return self._record_view(self.reference, kind, at, name, rank)
        master_step = np.abs(ref("master_weight", step) - ref("master_weight", step - 1))
        weight_step = np.abs(ref("weight", step) - ref("weight", step - 1))
        return bool(np.all((master_step < weight_step)[ref_moved]))

    def clip_coefficient(self, o, step, observed=None) -> float:
        """The clipping factor from the subject's own norm, else its recorded gradients' norm, else the oracle's
        (a gradient not recorded); 1 without clipping (docs/tolerances.md#the-sgd-identity)."""
        if self.train.clip <= 0:
            return 1.0
        norm = o.get("grad_norm", step, None, None) if self.claims.reports_grad_norm else None
        if norm is None and observed is not None:
            norm = observed[0]
        if norm is None:
            norm = self.oracle.get("grad_norm", step, None, None, None).numpy()
        return min(1.0, self.train.clip / (float(norm) + 1e-6))

    def observed_grad_norm(self, step, names) -> tuple[float, int] | None:
        """(float64 global norm, entries) of the subject's recorded gradients of ``names``, each counted once
        (replica 0, a replicated parameter from TP rank 0); None where one is missing or misshapen."""
        dp0 = min(o.dp_rank for o in self.obs.values())
        squares, entries = 0.0, 0
        for rank, o in sorted(self.obs.items()):
            for name in names:
                if o.dp_rank != dp0 or (self.claims.param_shards.get(name) is None and o.tp_rank != 0):
                    continue
                got = o.get("grad", step, None, name)
                want = self._record_view(self.oracle, "grad", step, name, rank)
                if got is None or got.shape != want.shape:
                    return None
                squares += float(np.sum(np.square(got.astype(np.float64))))
                entries += got.size
        return float(np.sqrt(squares)), entries

    def check_sgd_identity(self, name, prev, grad, new, lr, step, rank, clipped=False, coefficient_error=0.0) -> None:
        if self.dtype == "fp32" and not clipped:
            # SGD without momentum is p.add_(g, alpha=-lr) in float32: redo that very operation.
            want = torch.from_numpy(prev).float().add(torch.from_numpy(grad).float(), alpha=-lr).double().numpy()
            self.exact(f"sgd_update[{name}]", new, want, step=step, rank=rank)
            return
        if not getattr(self.train, "master", True) and self.dtype in ("bf16", "fp16") and not clipped:
            # No float32 master: torch.optim.SGD's add on the low-precision values, bitwise, by either of
            # torch's two CPU kernel paths (docs/tolerances.md#the-sgd-identity).
            low = {"bf16": torch.bfloat16, "fp16": torch.float16}[self.dtype]
            w, g = (torch.from_numpy(a).to(low).float() for a in (prev, grad))
            alpha = torch.tensor(-lr, dtype=torch.float32).to(low).float()
            body = (w + alpha * g).to(low).double().numpy()
            tail = (w + (alpha * g).to(low).float()).to(low).double().numpy()
            want = np.where(new == tail, tail, body)
            self.exact(f"sgd_update[{name}]", new, want, step=step, rank=rank)
            return
        want = prev - lr * grad
        # An empty shard holds it vacuously; the scale is the larger weight, before or after the update.
        measured = float(np.max(np.abs(new - want))) if new.size else 0.0
        scale = float(max(np.max(np.abs(new)), np.max(np.abs(prev)))) if new.size else 0.0
        update = float(np.max(np.abs(lr * grad))) if new.size else 0.0
        bound = sgd_identity_bound(self.dtype, scale, clipped, update, coefficient_error)
        self.add(f"sgd_update[{name}]", measured <= bound, step=step, rank=rank, measured=measured, bound=bound)

    def check_saved(self) -> None:
        """save axis: what global rank 0 wrote (deepspeed_autotp.saved_state_dict) must be the unsharded model's
        state_dict, keys, dtypes and final weights (docs/checks.md, saved_keys)."""
        if self.values.optional("save", "none") == "none":
            return
        last = self.train.steps - 1
        saver = self.obs.get(0)
        saved = None if saver is None else saver.facts.get("saved")
        if saved is None:
            self.add("saved_keys", False, rank=0, detail="global rank 0 recorded no saved state dict")
            return
        model = self.subject.build(self.values, torch.float32)  # for its keys and ties only
        canonical = {id(p): n for n, p in model.named_parameters()}
        names = {n: canonical[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
        want_keys = list(model.state_dict())
        self.add("saved_keys", sorted(saved) == sorted(want_keys), rank=0,
                 detail=f"missing {sorted(set(want_keys) - set(saved))}, unexpected {sorted(set(saved) - set(want_keys))}"
                 if sorted(saved) != sorted(want_keys) else f"{len(want_keys)} keys, as the unsharded model's")
        layouts = getattr(self.reference, "layouts", {})
        for key in want_keys:
            name = names.get(key)
            got, dtype = saved.get(key, (None, None))
            if name is None:
                continue  # a buffer: the tiny model has none
            self.exact(f"saved[{key}]", got, self.assembled_weight(name, last, 0), rank=0)
            ref_dtype = layouts.get(("weight", last, None, None, name), (None,))[0]
            if got is not None:
                self.add(f"saved_dtype[{key}]", dtype == ref_dtype, rank=0, detail=f"saved {dtype}, model {ref_dtype}")
            self.close_record(f"saved_weight[{key}]", got, ("weight", last, None, None, name), rank=0)

    def check_replicas_agree(self) -> None:
        """Replicated values must be bitwise identical on every rank that holds them."""
        ranks = sorted(self.obs)
        first = self.obs[ranks[0]]
        for key, value in first.tensors.items():
            kind, step, micro, name = key
            if kind in self.claims.micro_records or micro is not None:  # head_input: a stage input, replicated
                if self.claims.micro_records.get(kind) is not None:
                    continue
                peers = [r for r in ranks[1:] if self.obs[r].dp_rank == first.dp_rank]
            elif self.claims.param_shards.get(name) is None:
                peers = ranks[1:]
            else:  # a shard: the same on every data-parallel replica of this TP rank
                peers = [r for r in ranks[1:] if self.obs[r].tp_rank == first.tp_rank]
            for r in peers:
                other = self.obs[r].tensors.get(key)
                # equal_nan: a replicated nan (torch's 0/0 on every rank) is the same value everywhere
                if other is None or other.shape != value.shape or not np.array_equal(other, value, equal_nan=True):
                    where = f"{kind}[{name}]" if name else kind
                    self.add(f"replicas_agree[{where}]", False, step=step, micro=micro, rank=r,
                             detail=f"rank {r} differs from rank {ranks[0]}")
                    return
        self.add("replicas_agree", True, detail="all replicated tensors bitwise equal across ranks")


def compare(subject, values, observations, reference, oracle, collectives=None) -> list[Check]:
    return Comparison(subject, values, observations, reference, oracle, collectives).run()


class ReferenceCache:
    """The reference pairs one runner has computed, by reference_key: a bounded, locked LRU (size 0: none) and,
    with --reference-cache DIR, a ReferenceDisk behind it (docs/checks.md#how-the-comparison-works)."""

    def __init__(self, size: int = DEFAULT_REFERENCE_CACHE_SIZE, disk_dir=None):
        self.memory = BoundedCache(size, stats=True)
        self.disk = None
        if disk_dir is not None:
            from parity.checks.reference_disk import ReferenceDisk

            self.disk = ReferenceDisk(disk_dir)

    @classmethod
    def from_settings(cls, settings) -> ReferenceCache:
        return cls(settings.reference_cache_size, settings.reference_disk)

    def pair(self, subject, values) -> tuple[Trajectory, Trajectory]:
        """reference_pair, kept here by the subject's reference_key."""
        key = subject.reference_key(values)
        pair = self.memory.get(key)
        if pair is not None:
            return pair
        # Computed outside the lock: two jobs may compute one key at once, to the same numbers.
        disk = self.disk if key is not None else None
        pair = disk.load(key) if disk else None
        if pair is None:
            pair = reference_pair(subject, values)
            if disk:
                disk.save(key, pair)
        self.memory.put(key, pair)
        return pair

    def stats(self) -> dict:
        """Hits and misses (parity run --profile), and the disk copy's counts where there is one."""
        return {**self.memory.stats, **(self.disk.stats if self.disk else {})}

    def clear(self) -> None:
        """Drop the pairs kept in memory, and the rounding samples that are reruns of them."""
        self.memory.clear()
        rounding.clear_cache()


def state_after_rejection_checks(rank: int, facts: dict) -> list[Check]:
    """A refused setup must leave the user's model or inputs and the process-global switches (``extra[...]``) as
    they were: two checks, each failing where the snapshots are missing (docs/checks.md#how-the-comparison-works)."""
    before, after = facts.get("state_before"), facts.get("state_after")
    names = ("state_after_rejection", "process_state_after_rejection")
    if before is None or after is None:
        return [Check(n, False, rank=rank, detail="the rank recorded no state after the error") for n in names]
    checks = []
    for name, process in zip(names, (False, True)):
        keys = sorted(k for k in set(before) | set(after) if k.startswith("extra[") == process)
        changed = [f"{k}: {before.get(k, '<absent>')} -> {after.get(k, '<absent>')}"
                   for k in keys if before.get(k) != after.get(k)]
        what = "process-global switches" if process else "model (or inputs)"
        detail = (f"{len(changed)} changed after the error: " + "; ".join(changed[:4]) if changed
                  else f"{what} untouched ({len(keys)} entries)")
        checks.append(Check(name, not changed, rank=rank, detail=detail))
    return checks


def reference_pair(subject, values) -> tuple[Trajectory, Trajectory]:
    """The reference at the case dtype and the float64 oracle, computed afresh (a ReferenceCache
    shares them between cases: the comparison only reads them)."""
    with one_torch_thread():  # a verdict must not depend on the core count (parity/checks/one_thread.py)
        return subject.reference(values), subject.reference(values, torch.float64)
