"""Observations from every rank + the reference trajectories -> a list of checks.

Expected shard slices come from parity.observe.partition, never from the subject. Sharded logits are
assembled here from the ranks' local blocks; the subject is only asked for what each rank holds.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from parity.observe.partition import shard_slice, split_sizes
from parity.checks.tolerances import parity_bound, sgd_identity_bound
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
        self.tp = values.get("tp", 1)
        self.grain = values.get("grain", 1)
        self.split = self.claims.split
        self.checks: list[Check] = []

    def add(self, *args, **kwargs) -> None:
        self.checks.append(Check(*args, **kwargs))

    # -- numbers ---------------------------------------------------------------------------------
    def close(self, name, got, ref, oracle, **where) -> None:
        if got is None:
            self.add(name, False, detail="not observed", **where)
            return
        if got.shape != oracle.shape:
            self.add(name, False, detail=f"shape {got.shape} != expected {oracle.shape}", **where)
            return
        measured = float(np.max(np.abs(got - oracle))) if got.size else 0.0
        bound = parity_bound(self.dtype, float(np.max(np.abs(ref - oracle))) if ref.size else 0.0,
                             float(np.max(np.abs(oracle))) if oracle.size else 0.0)
        finite = bool(np.all(np.isfinite(got)))
        self.add(name, finite and measured <= bound.value, measured=measured, bound=bound.value,
                 detail="" if finite else "non-finite values", **where)

    def exact(self, name, got, want, **where) -> None:
        if got is None or got.shape != want.shape:
            self.add(name, False, detail="not observed" if got is None else f"shape {got.shape} != {want.shape}",
                     **where)
            return
        diff = got != want
        detail = ""
        if diff.any():
            first = tuple(int(i) for i in np.argwhere(diff)[0])
            detail = f"{int(diff.sum())} of {diff.size} differ; first at {first}: {got[first]!r} vs {want[first]!r}"
        measured = float(np.max(np.abs(got - want))) if got.size else 0.0
        self.add(name, not diff.any(), measured=measured, bound=0.0, detail=detail, **where)

    # -- the checks ----------------------------------------------------------------------------
    def run(self) -> list[Check]:
        self.check_claims()
        self.check_initial_weights()
        for step in range(self.train.steps):
            for micro in range(self.train.micro_batches):
                self.check_micro(step, micro)
                self.check_collectives(step, micro)
            self.check_step(step)
        self.check_replicas_agree()
        return self.checks

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
        if self.claims.loss_backend is not None:
            self.check_backend_agreement()

    def check_backend_agreement(self) -> None:
        """DeepSpeed's Liger gate is decided on each rank alone: the ranks of one TP group must have run
        the same CE on every micro-batch, whatever the claim says (ranks that mix Liger and torch CE
        exchange mismatched all-reduces without hanging)."""
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

    def _param_view(self, name, array, rank, which: Trajectory):
        dim = self.claims.param_shards.get(name)
        full = which.get("weight", -1, None, None, name)
        total = full.shape[dim] if dim is not None else 0
        return _take(array, dim, total, self.tp, self.obs[rank].tp_rank, self.grain, self.split)

    def check_initial_weights(self) -> None:
        # No arithmetic separates a shard from the reference's slice: demand equality.
        for rank, o in sorted(self.obs.items()):
            for name in [k[4] for k in self.reference.records if k[0] == "weight" and k[1] == -1]:
                want = self._param_view(name, self.reference.get("weight", -1, None, None, name).numpy(),
                                        rank, self.reference)
                self.exact(f"initial_weight[{name}]", o.get("weight", -1, None, name), want, rank=rank)

    def check_micro(self, step: int, micro: int) -> None:
        for rank, o in sorted(self.obs.items()):
            dp = o.dp_rank
            for kind, dim in self.claims.micro_records.items():
                ref = self.reference.get(kind, step, micro, dp, None).numpy()
                orc = self.oracle.get(kind, step, micro, dp, None).numpy()
                got = o.get(kind, step, micro, None)
                if dim is not None:
                    total = orc.shape[dim]
                    want_width = split_sizes(total, self.tp, self.grain, self.split)[o.tp_rank]
                    width = None if got is None else got.shape[dim]
                    self.add(f"shard_width[{kind}]", width == want_width, step=step, micro=micro, rank=rank,
                             detail=f"local width {width}, partition formula says {want_width} of {total}")
                    ref = _take(ref, dim % ref.ndim, total, self.tp, o.tp_rank, self.grain, self.split)
                    orc = _take(orc, dim % orc.ndim, total, self.tp, o.tp_rank, self.grain, self.split)
                if kind in self.claims.exact_records:
                    self.exact(kind, got, ref, step=step, micro=micro, rank=rank)
                else:
                    self.close(kind, got, ref, orc, step=step, micro=micro, rank=rank)
                if dim is not None and o.tp_rank == 0:
                    self.check_assembled(kind, dim, step, micro, dp)

    def check_assembled(self, kind, dim, step, micro, dp) -> None:
        """Concatenate the TP group's blocks in rank order: the harness, not the subject, assembles."""
        group = sorted((o.tp_rank, o.get(kind, step, micro, None)) for o in self.obs.values() if o.dp_rank == dp)
        blocks = [b for _, b in group]
        if any(b is None for b in blocks) or len(blocks) != self.tp:
            self.add(f"assembled[{kind}]", False, step=step, micro=micro, detail="missing rank blocks")
            return
        try:
            assembled = np.concatenate(blocks, axis=dim)
        except ValueError as exc:
            self.add(f"assembled[{kind}]", False, step=step, micro=micro, detail=str(exc))
            return
        self.close(f"assembled[{kind}]", assembled, self.reference.get(kind, step, micro, dp, None).numpy(),
                   self.oracle.get(kind, step, micro, dp, None).numpy(), step=step, micro=micro)

    def check_step(self, step: int) -> None:
        lr = self.train.lr
        names = [k[4] for k in self.reference.records if k[0] == "grad" and k[1] == step]
        for rank, o in sorted(self.obs.items()):
            for name in names:
                ref_g = self._param_view(name, self.reference.get("grad", step, None, None, name).numpy(), rank,
                                         self.reference)
                orc_g = self._param_view(name, self.oracle.get("grad", step, None, None, name).numpy(), rank,
                                         self.reference)
                got_g = o.get("grad", step, None, name)
                self.close(f"grad[{name}]", got_g, ref_g, orc_g, step=step, rank=rank)
                # A gradient must be nonzero wherever the oracle's is (and zero where a whole step
                # is ignored): a subject that computes nothing cannot pass on matching zeros.
                oracle_moves = bool(np.any(orc_g != 0))
                if got_g is not None:
                    self.add(f"grad_nonzero[{name}]", bool(np.any(got_g != 0)) == oracle_moves, step=step,
                             rank=rank, detail=f"gradient {'all zeros' if oracle_moves else 'nonzero'}, "
                                               f"oracle's {'nonzero' if oracle_moves else 'all zeros'}")
                ref_w = self._param_view(name, self.reference.get("weight", step, None, None, name).numpy(), rank,
                                         self.reference)
                orc_w = self._param_view(name, self.oracle.get("weight", step, None, None, name).numpy(), rank,
                                         self.reference)
                got_w = o.get("weight", step, None, name)
                self.close(f"weight[{name}]", got_w, ref_w, orc_w, step=step, rank=rank)
                prev = o.get("weight", step - 1, None, name)
                if got_w is None or prev is None or got_g is None or not got_w.shape == prev.shape == got_g.shape:
                    continue  # already failed above, as not observed or of the wrong shape
                self.check_weight_moved(name, got_w, prev, oracle_moves, step, rank)
                self.check_sgd_identity(name, prev, got_g * self.clip_coefficient(o, step), got_w, lr, step, rank,
                                        clipped=self.train.clip > 0)
            if self.claims.reports_grad_norm:
                self.close("grad_norm", o.get("grad_norm", step, None, None),
                           self.reference.get("grad_norm", step, None, None, None).numpy(),
                           self.oracle.get("grad_norm", step, None, None, None).numpy(), step=step, rank=rank)

    def check_weight_moved(self, name, got_w, prev, oracle_moves, step, rank) -> None:
        """A weight must move when the gradient is nonzero and stay put when it is zero. An update
        smaller than half a unit of the weight's dtype (tiny after clipping in bf16) rounds away in
        the reference at that dtype too; then only 'no movement without gradient' is required."""
        moved = bool(np.any(got_w != prev))
        ref_now = self._param_view(name, self.reference.get("weight", step, None, None, name).numpy(), rank,
                                   self.reference)
        ref_before = self._param_view(name, self.reference.get("weight", step - 1, None, None, name).numpy(),
                                      rank, self.reference)
        if not oracle_moves:
            self.add(f"weight_changed[{name}]", not moved, step=step, rank=rank,
                     detail="weight moved on a step with no gradient")
        elif bool(np.any(ref_now != ref_before)):
            self.add(f"weight_changed[{name}]", moved, step=step, rank=rank,
                     detail="optimizer step left the weight unchanged")

    def clip_coefficient(self, o, step) -> float:
        """The clipping factor: from the subject's own norm where it reports one, else the oracle's
        (then the weights check is what holds the subject to it). 1 without clipping."""
        if self.train.clip <= 0:
            return 1.0
        norm = o.get("grad_norm", step, None, None) if self.claims.reports_grad_norm else None
        if norm is None:
            norm = self.oracle.get("grad_norm", step, None, None, None).numpy()
        return min(1.0, self.train.clip / (float(norm) + 1e-6))

    def check_sgd_identity(self, name, prev, grad, new, lr, step, rank, clipped=False) -> None:
        if self.dtype == "fp32" and not clipped:
            # SGD without momentum is p.add_(g, alpha=-lr) in float32: redo that very operation.
            want = torch.from_numpy(prev).float().add(torch.from_numpy(grad).float(), alpha=-lr).double().numpy()
            self.exact(f"sgd_update[{name}]", new, want, step=step, rank=rank)
            return
        want = prev - lr * grad
        # An empty shard (a row head's hidden 2 over 3 ranks gives 1,1,0) holds the identity vacuously,
        # as the other checks treat empty arrays (found by parity explore: the reduction raised).
        measured = float(np.max(np.abs(new - want))) if new.size else 0.0
        # The master weight's half unit is of the weight before the update, the cast back's of the one
        # after: scale by the larger (weights that shrink in a step made a bound of |new| too tight,
        # found by parity explore --seed 2 on a 2-row embedding).
        scale = float(max(np.max(np.abs(new)), np.max(np.abs(prev)))) if new.size else 0.0
        bound = sgd_identity_bound(self.dtype, scale, clipped)
        self.add(f"sgd_update[{name}]", measured <= bound, step=step, rank=rank, measured=measured, bound=bound)

    def check_replicas_agree(self) -> None:
        """Replicated values must be bitwise identical on every rank that holds them."""
        ranks = sorted(self.obs)
        first = self.obs[ranks[0]]
        for key, value in first.tensors.items():
            kind, step, micro, name = key
            if kind in self.claims.micro_records:
                if self.claims.micro_records[kind] is not None:
                    continue
                peers = [r for r in ranks[1:] if self.obs[r].dp_rank == first.dp_rank]
            elif self.claims.param_shards.get(name) is None:
                peers = ranks[1:]
            else:  # a shard: the same on every data-parallel replica of this TP rank
                peers = [r for r in ranks[1:] if self.obs[r].tp_rank == first.tp_rank]
            for r in peers:
                other = self.obs[r].tensors.get(key)
                if other is None or other.shape != value.shape or np.any(other != value):
                    where = f"{kind}[{name}]" if name else kind
                    self.add(f"replicas_agree[{where}]", False, step=step, micro=micro, rank=r,
                             detail=f"rank {r} differs from rank {ranks[0]}")
                    return
        self.add("replicas_agree", True, detail="all replicated tensors bitwise equal across ranks")


def compare(subject, values, observations, reference, oracle, collectives=None) -> list[Check]:
    return Comparison(subject, values, observations, reference, oracle, collectives).run()


# Cases that differ only in how the subject shards or runs (ZeRO stage, topology, backend, head
# name rules...) share one reference: the reference is a function of the subject's reference_key
# alone. A bounded LRU keeps the parent's memory flat over long runs; each pair of a tiny model's
# trajectories is tens of kB.
REFERENCE_CACHE_SIZE = 256
_reference_cache: OrderedDict = OrderedDict()
_reference_lock = threading.Lock()  # parity run -j: jobs judge cases in parallel threads
reference_cache_stats = {"hits": 0, "misses": 0}


def reference_pair(subject, values) -> tuple[Trajectory, Trajectory]:
    """The reference at the case dtype and the float64 oracle, computed once per reference_key.

    The trajectories are shared between cases: the comparison only reads them."""
    key = subject.reference_key(values)
    with _reference_lock:
        if key is not None and key in _reference_cache:
            _reference_cache.move_to_end(key)
            reference_cache_stats["hits"] += 1
            return _reference_cache[key]
        reference_cache_stats["misses"] += 1
    # Computed outside the lock, so jobs overlap; two jobs may compute one key at once, and both
    # results are the same numbers (the reference is deterministic), so either may be kept.
    pair = subject.reference(values), subject.reference(values, torch.float64)
    if key is not None:
        with _reference_lock:
            _reference_cache[key] = pair
            if len(_reference_cache) > REFERENCE_CACHE_SIZE:
                _reference_cache.popitem(last=False)
    return pair


def clear_reference_cache() -> None:
    with _reference_lock:
        _reference_cache.clear()
