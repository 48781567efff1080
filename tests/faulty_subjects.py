"""Deliberately wrong or misbehaving subjects: the suite must report every one of them.

Loaded into parent and rank processes through PARITY_SUBJECT_MODULES=tests.faulty_subjects.
"""
from __future__ import annotations

import os
import time

from parity.subjects.deepspeed_autotp import ColumnGatheredHead


class DroppedInputGradAllReduce(ColumnGatheredHead):
    """ColumnParallel.backward without its all-reduce: the head-input gradient misses the other shard's term."""
    name = "faulty_dropped_allreduce"

    def run_rank(self, values, ctx):
        from deepspeed.module_inject import layers

        original = layers.ColumnParallel.backward
        layers.ColumnParallel.backward = staticmethod(lambda c, grad: (None, grad))
        try:
            return super().run_rank(values, ctx)
        finally:
            layers.ColumnParallel.backward = original


class UnshardedHead(ColumnGatheredHead):
    """Claims a column-parallel head but configures nothing: the head stays a replicated nn.Linear."""
    name = "faulty_unsharded_head"

    def tensor_parallel_config(self, values):
        return {"partition_config": {"use_default_specs": False, "layer_specs": [
            {"patterns": [r"proj\.weight$"], "partition_type": "skip"}]}}


class RaisesOnRankOne(ColumnGatheredHead):
    """Rank 1 fails before initialize; rank 0 then waits in a collective rank 1 never joins."""
    name = "faulty_raises_on_rank1"

    def run_rank(self, values, ctx):
        if ctx.rank == 1:
            raise RuntimeError("planted failure on rank 1")
        return super().run_rank(values, ctx)


class HangsOnRankZero(ColumnGatheredHead):
    name = "faulty_hangs_on_rank0"

    def run_rank(self, values, ctx):
        if ctx.rank == 0:
            planted_hang()
        return super().run_rank(values, ctx)


def planted_hang():
    time.sleep(3600)


class DiesOnRankOne(ColumnGatheredHead):
    name = "faulty_dies_on_rank1"

    def run_rank(self, values, ctx):
        if ctx.rank == 1:
            os._exit(3)
        return super().run_rank(values, ctx)


class AbortsOnRankOne(ColumnGatheredHead):
    """Rank 1 dies as a process that gloo's C++ enforce aborts does (std::terminate, SIGABRT) while rank 0 waits in a
    collective with it."""
    name = "faulty_aborts_on_rank1"

    def run_rank(self, values, ctx):
        if ctx.rank == 1:
            os.write(2, b"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
                        b"  what():  [enforce fail] planted: Is there a distributed collective mismatch in your code?\n")
            os.abort()
        return super().run_rank(values, ctx)


class LeavesStateBehind(ColumnGatheredHead):
    """Passes itself, then leaves AutoTP's process-global switches flipped for the next case."""
    name = "faulty_leaves_state"

    def run_rank(self, values, ctx):
        obs = super().run_rank(values, ctx)
        from deepspeed.module_inject import layers

        layers.TensorParallel_Layer.tp_overlap_comm = True
        layers.TensorParallel_Layer.keep_module_on_host = True
        return obs


class AlwaysRejects(ColumnGatheredHead):
    name = "faulty_always_rejects"

    def run_rank(self, values, ctx):
        raise ValueError(f"planted rejection on rank {ctx.rank}")


class Float32Logits(ColumnGatheredHead):
    """Hands back its logits upcast to float32 in a bf16 case: every value is the bf16 one exactly, so
    every bound holds; only the precision contract (parity/checks/contract.py) can see it."""
    name = "faulty_fp32_logits"

    def forward(self, engine, batch, num_items, spec):
        loss, logits = super().forward(engine, batch, num_items, spec)
        return loss, logits.float()




class RejectsAfterConverting(ColumnGatheredHead):
    """Raises the expected error, but only after changing the user's model (``plant``): on rank 1 the
    head is swapped for a half-size one (a half-converted model), or a process switch is flipped, or
    no state is recorded at all; "none" leaves everything as it was."""
    plant = "none"

    def records_state_after_rejection(self, values):
        return True

    def run_rank(self, values, ctx):
        import torch

        from parity.observe.model_state import model_state
        from references.tiny_lm import build_model

        spec = self.model_spec(values)
        model = build_model(spec, 1234, torch.float32)
        switch = {"planted_switch": False}
        before = model_state(model, **switch)
        if ctx.rank == 1 and self.plant == "convert":
            model.lm_head = torch.nn.Linear(spec.hidden, spec.vocab // 2)
        if ctx.rank == 1 and self.plant == "switch":
            switch["planted_switch"] = True
        exc = ValueError(f"planted rejection on rank {ctx.rank}")
        if self.plant != "unrecorded":
            exc.parity_facts = {"state_before": before, "state_after": model_state(model, **switch)}
        raise exc


def _rejects(plant: str) -> RejectsAfterConverting:
    subject = RejectsAfterConverting()
    subject.name, subject.plant = f"faulty_rejects_{plant}", plant
    return subject


SUBJECTS = [DroppedInputGradAllReduce(), UnshardedHead(), RaisesOnRankOne(), HangsOnRankZero(), DiesOnRankOne(), AbortsOnRankOne(),
            LeavesStateBehind(), AlwaysRejects(), Float32Logits()] + [_rejects(p) for p in ("none", "convert", "switch", "unrecorded")]
