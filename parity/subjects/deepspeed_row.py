"""DeepSpeed 0.19.8 row-parallel (hidden-dimension) output head in training: a ``partition_type: "row"`` spec,
full logits on every rank (docs/subjects.md#row-parallel-head)."""
from __future__ import annotations

import dataclasses

from parity.subjects.base import head_claims
from parity.subjects.deepspeed_autotp import (AUTOCAST_MODULES_AXES, COMMON_AXES, EngineHead, head_spec,
                                              reports_grad_norm, skip_proj_specs)


class RowParallelHead(EngineHead):
    name = "row_parallel"
    feature = "row head"
    description = ("#8538: lm_head as row-parallel LinearAllreduceWithReplicatedInput, selected by a "
                   "partition_config row spec in training; weight sharded along hidden, bias replicated, "
                   "full logits after the all-reduce, the suite's CE on top.")
    # head_input: the head also takes a flattened [B*T, H] hidden state (the scatter narrows dim -1).
    axes = {**COMMON_AXES, "head_input": None, "save": None, **AUTOCAST_MODULES_AXES}

    def model_spec(self, values):
        return dataclasses.replace(super().model_spec(values), head_input=values.optional("head_input", "sequence"))

    def tensor_parallel_config(self, values):
        return skip_proj_specs(head_spec(values["head"], "row"))

    def claims(self, values):
        return head_claims(values["head"], "LinearAllreduceWithReplicatedInput", 1, None,
                           reports_grad_norm=reports_grad_norm(values))
