"""DeepSpeed 0.19.8's legacy inference output head, ``LmHeadLinearAllreduce``, through init_inference: the logits,
which all-reduce ran and the forward's collectives (docs/subjects.md#inference-head)."""
from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from unittest import mock

import torch

from parity.observe import collectives
from parity.observe.observations import RankObservations
from parity.subjects.base import NAMED_HEADS, RankContext, case_seed, head_claims
from parity.subjects.driver import param_structure, record_structure
from parity.subjects.loss_only import tp_group
from parity.subjects.deepspeed_autotp import (CLEAN_STATE, DeepSpeedSubject, engine_dtype_requirements,
                                             reset_deepspeed_state, setup_deepspeed, user_mpu)
from parity.observe.dtypes import DTYPES
from references.tiny_lm import build_model
from references.trajectory import Trajectory, TrainingSpec

INFERENCE_DEFAULT_GRAIN = 64
TORCH_ALL_REDUCE = "torch.distributed.all_reduce"
# The ISA the shm op's reduce kernels need (shm_interface.cpp vector_kernel_level: fp32 level 1, bf16/fp16 level 2).
SHM_ISA = {"fp32": "avx2", "bf16": "avx512bw", "fp16": "avx512bw"}


def expected_all_reduce(values: dict) -> str:
    """Which implementation must sum the partial logits, by DeepSpeed's documented gate (comm/torch.py
    inference_all_reduce), computed from the CPU's own flags."""
    from parity.observe.capabilities import cpu_flags

    if values["allreduce"] == "shm" and SHM_ISA[values["dtype"]] in cpu_flags():
        return "shm"
    return TORCH_ALL_REDUCE


@functools.cache
def prebuild_shm_op() -> None:
    """Build DeepSpeed's shm op once, in a child process, before the first shm case runs, so its ranks load it
    from torch's extension cache; a failed build is no skip. Why: docs/subjects.md#deepspeeds-cpu-shm-op"""
    code = ("from deepspeed.accelerator import get_accelerator; "
            "get_accelerator().create_op_builder('ShareMemCommBuilder').load()")
    try:
        subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=1800)
    except subprocess.TimeoutExpired:
        pass


def shm_op(ctx: RankContext):
    """(op, vector kernel level): DeepSpeed's shm op, set up once per rank process as init_distributed does under
    DeepSpeed's launcher (docs/subjects.md#inference-head)."""
    state = ctx.state["deepspeed"]
    if "shm_op" not in state:
        op = state["build_shm_op"]()
        if op is None:
            raise RuntimeError("DeepSpeed's ShareMemCommBuilder reports its shm op incompatible with this machine")
        saved = os.environ.get("LOCAL_SIZE")
        os.environ["LOCAL_SIZE"] = str(ctx.world_size)
        try:
            op.initialize(ctx.world_size, ctx.rank)
        finally:
            if saved is None:
                os.environ.pop("LOCAL_SIZE")
            else:
                os.environ["LOCAL_SIZE"] = saved
        state["shm_op"] = (op, op.vector_kernel_level())
    return state["shm_op"]


class InferenceHead(DeepSpeedSubject):
    name = "inference_head"
    feature = None
    description = ("legacy inference: deepspeed.init_inference(tensor_parallel tp_size) shards lm_head as "
                   "LmHeadLinearAllreduce (hidden shard, inference_all_reduce of partial logits); logits only.")
    # head_input flat: the head gets a 2-D [tokens, hidden] state, as a model run on one unbatched sequence hands it.
    axes = {"dtype": None, "vocab": None, "hidden": None, "tied": None, "bias": None, "head": NAMED_HEADS, "tp": None,
            "grain": None, "device": None, "allreduce": None, "tp_source": None, "head_input": None, "prior_tp": None,
            "dp": None}
    defaults = {"grain": INFERENCE_DEFAULT_GRAIN}
    clean_state = {**CLEAN_STATE, "shm_vector_kernel_level": 0}

    def world_size(self, values):
        return max(values["tp"] * values["dp"], values["prior_tp"])

    def invalid(self, values):
        prior = values["prior_tp"]
        if prior and prior % values["tp"]:
            return f"prior_tp {prior} is no multiple of tp {values['tp']} (the ranks past tp are copies of its layout)"
        if values["dp"] > 1 and (prior or values["tp_source"] != "tp_size"):
            return "dp: a fresh process's group made from tp_size (no earlier engine's, no mpu's)"
        if values["dp"] > 1 and values["head"] == "model.lm_head":
            # set_lm_head never hands a nested head to AutoTP, so no rank meets the group: the nested-head divergence
            return "dp: a nested head is never sharded, so tp_size's group reaches no layer"
        if prior and values["tp_source"] != "tp_size":
            return "prior_tp: the cached group is read by the tp_size path only (an mpu hands over its own group)"
        return super().invalid(values)

    def requires(self, values):
        shm = ["cpp_toolchain"] if values["allreduce"] == "shm" else []
        return super().requires(values) + engine_dtype_requirements(values) + shm

    def unavailable_reason(self, values):
        reason = super().unavailable_reason(values)
        if reason is None and values["allreduce"] == "shm":
            prebuild_shm_op()
        return reason

    def training_spec(self, values):
        return TrainingSpec(seed=case_seed(TrainingSpec.seed, values), steps=1, micro_batches=1)

    def model_spec(self, values):
        return dataclasses.replace(super().model_spec(values), head_input=values["head_input"])

    def claims(self, values):
        return head_claims(values["head"], "LmHeadLinearAllreduce", 1, None, micro_records={"logits": None},
                           collective_path=expected_all_reduce(values))

    def reference(self, values, compute_dtype=None):
        """The forward alone: initial weights and the logits of the first micro-batch."""
        spec, train = self.model_spec(values), self.training_spec(values)
        model = build_model(spec, train.seed, DTYPES[values["dtype"]]).to(compute_dtype or DTYPES[values["dtype"]])
        traj = Trajectory()
        for name, p in model.named_parameters():  # a tied head appears once, as embed_tokens.weight
            traj.put("weight", -1, None, None, name, p)
        if spec.tied:
            # The user's tied model answers to its head's name too (the same Parameter); the engine
            # hands that name back for its (cloned) head, so the reference must hold it there.
            head = model.get_submodule(spec.head_name)
            traj.put("weight", -1, None, None, f"{spec.head_name}.weight", head.weight)
        batch = train.batches(0, 0, spec.vocab, spec.ignore_index)[0]
        with torch.no_grad():
            _, logits = model(batch["input_ids"])
        for copy in range(self.world_size(values) // values["tp"]):  # every copy of the layout is fed that input
            traj.put("logits", 0, 0, copy, None, logits)
        return traj

    def reset_process_state(self, ctx: RankContext) -> dict:
        from deepspeed.comm import comm as ds_comm

        setup_deepspeed(ctx)
        # A registered shm op stays registered; level 0 is DeepSpeed's own fallback to torch's all_reduce.
        ds_comm.cdb.shm_vector_kernel_level = 0
        return {**reset_deepspeed_state(), "shm_vector_kernel_level": ds_comm.cdb.shm_vector_kernel_level}

    def run_rank(self, values, ctx):
        import deepspeed
        from deepspeed.comm import comm as ds_comm
        from deepspeed.inference.engine import InferenceEngine
        import torch.distributed as dist

        setup_deepspeed(ctx)
        tp = values["tp"]
        tp_rank, dp_rank = ctx.tp_dp(tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        model = build_model(spec, train.seed, dtype).to(ctx.device)
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        prior = values["prior_tp"]
        # A fresh process beyond tp's ranks: DeepSpeed's own new_group(range(tp_size)) is the behaviour under test.
        fresh = values["dp"] > 1
        # The group InferenceEngine caches on its class for every later engine: one per TP size, installed per case.
        InferenceEngine.inference_mp_group = None if fresh else tp_group(ctx, prior or tp)
        if prior:
            # The user's first engine, on a model of its own; it finds (and keeps) the group of all its ranks.
            first = build_model(spec, train.seed + 1, dtype).to(ctx.device)
            deepspeed.init_inference(first, tensor_parallel={"tp_size": prior}, dtype=dtype,
                                     replace_with_kernel_inject=False, injection_policy={type(first): ("proj",)})
        if values["allreduce"] == "shm":
            ds_comm.cdb.shm_comm_op, ds_comm.cdb.shm_vector_kernel_level = shm_op(ctx)
        if values["tp_source"] == "mpu":
            # The TP group a Megatron-style mpu hands over (inference/config.py:46, engine.py:113-115): the same
            # members as the group tp_size makes, so any difference is in how the group reaches the head.
            group = InferenceEngine.inference_mp_group  # every rank of it one model replica: no data parallelism
            tensor_parallel = {"mpu": user_mpu(model_parallel_group=group, model_parallel_rank=dist.get_rank(group),
                                               model_parallel_world_size=dist.get_world_size(group),
                                               data_parallel_world_size=1, data_parallel_rank=0)}
        else:
            tensor_parallel = {"tp_size": tp}
        if values["grain"] != INFERENCE_DEFAULT_GRAIN:
            tensor_parallel["tp_grain_size"] = values["grain"]
        engine = deepspeed.init_inference(model, tensor_parallel=tensor_parallel, dtype=dtype,
                                          replace_with_kernel_inject=False,
                                          injection_policy={type(model): ("proj",)})
        # What init_inference built, before the forward: the claimed modules and each parameter's local shape
        # (structure[...], parity/checks/compare.py check_structure).
        record_structure(obs, engine.module, self.claims(values))
        params = dict(engine.module.named_parameters())
        obs.facts["structure"]["params"] = {name: param_structure(p) for name, p in params.items()}
        for name, p in params.items():
            obs.record("weight", -1, None, name, p)
        reduces = []
        backend = ds_comm.cdb
        original = backend.inference_all_reduce

        def all_reduces():  # on a group of any size: a head sharded over another group than tp's still took torch's
            return sum(n for kind, n in counts.items() if kind.startswith("all_reduce@"))

        def counted(tensor, *args, **kwargs):
            before = all_reduces()
            result = original(tensor, *args, **kwargs)
            torch_path = all_reduces() > before
            reduces.append(TORCH_ALL_REDUCE if torch_path else "shm")
            if not torch_path:  # the shm op is no torch.distributed call; it is still the head's one TP all-reduce
                counts[f"all_reduce@{tp}"] += 1
            return result

        batch = train.batches(0, 0, spec.vocab, spec.ignore_index)[0]  # one input for every rank (prior_tp)
        # Counted, not asserted: a replicated (nested) head must fail a check beside agreeing logits, not crash.
        # An instance attribute for the forward; the class method shows again after it.
        with (mock.patch.object(backend, "inference_all_reduce", counted), torch.no_grad(),
              collectives.recording() as counts):
            _, logits = engine(batch["input_ids"].to(ctx.device))
        obs.record("logits", 0, 0, None, logits)
        obs.facts["collective_path"] = reduces
        obs.facts["collectives"] = {(0, 0): dict(counts)}
        return obs
