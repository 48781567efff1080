"""DeepSpeed 0.19.8's legacy inference output head, ``LmHeadLinearAllreduce``, logits only.

Reached the way a user reaches it: ``deepspeed.init_inference(model, tensor_parallel={"tp_size": tp},
replace_with_kernel_inject=False, injection_policy=...)``. After the layer policy runs,
``replace_transformer_layer`` calls ``set_lm_head``, which hands the module's ``lm_head`` (or
``embed_out``) to AutoTP with ``all_reduce_linears=("lm_head",)`` and ``training_mode=False``:
``LmHeadLinearAllreduce`` keeps the weight's hidden-dimension shard [V, H_r] (a cloned Parameter:
a tied head is untied from its embedding, which stays whole), narrows the input's last dim to
H_r, multiplies, ``inference_all_reduce``s the partial logits and adds the replicated bias.

Why an injection_policy: the automatic path (tensor_parallel only) runs ``AutoTP.tp_parser``,
which asserts that the model's repr names a ``...Model`` and that it holds an ``nn.ModuleList`` of
transformer blocks; the suite's TinyCausalLM has neither and is refused with "Not able to
determine model policy automatically. Please provide policy." So the subject takes the documented
user-policy path instead, naming the model's own class and its ``proj``: ``replace_module`` only
visits children, so no layer is replaced and ``proj`` stays a plain Linear (a claim), and
``set_lm_head`` shards the head.

``inference_all_reduce`` on CPU: the shm op is not built (README "Decisions"), so
``torch.ops.deepspeed.inference_all_reduce_`` does not exist and DeepSpeed falls back to
``torch.distributed.all_reduce`` on the TP group; the rank records which one ran, and the forward's
collectives are counted for the case file's ``[matrix.collectives]`` (one all-reduce).

A nested head (``head = "model.lm_head"``): ``set_lm_head`` tests ``hasattr(module, "lm_head")`` on the
top-level model only, so the head stays a replicated ``nn.Linear`` and nothing is reduced; the claims
stay those of a sharded head, so the module type, the initial shard and the collective count fail
while the logits agree (a known divergence, ``cases/deepspeed_inference.toml``).

Grain: ``init_inference``'s ``tensor_parallel.tp_grain_size`` defaults to 64 (training's to 1). The
subject's grain default is 64 and is then not passed (the user's default); any other value is passed.
"""
from __future__ import annotations

import torch

from parity.observe import collectives
from parity.observe.observations import RankObservations
from parity.subjects.base import Claims, RankContext, Subject, case_seed
from parity.subjects.deepspeed_autotp import (CLEAN_STATE, _attribute, engine_dtype_requirements, reset_deepspeed_state,
                                             setup_deepspeed)
from parity.observe.dtypes import DTYPES
from references.tiny_lm import build_model
from references.trajectory import Trajectory, TrainingSpec

INFERENCE_DEFAULT_GRAIN = 64


def inference_group(ctx: RankContext, tp: int):
    """InferenceEngine makes its TP group once per process, ``new_group(range(tp_size))``, and caches it
    on the class (``InferenceEngine.inference_mp_group``) for every later engine whatever its tp_size.
    One plain group per TP size is made here and installed before each case instead."""
    from parity.subjects.loss_only import tp_group

    return tp_group(ctx, tp)


class GroupMpu:
    """An mpu whose model-parallel group is ``group`` (every rank of it one model replica: no data parallelism)."""

    def __init__(self, group):
        self.group = group

    def get_model_parallel_group(self):
        return self.group

    def get_model_parallel_world_size(self):
        import torch.distributed as dist

        return dist.get_world_size(self.group)

    def get_model_parallel_rank(self):
        import torch.distributed as dist

        return dist.get_rank(self.group)

    def get_data_parallel_world_size(self):
        return 1

    def get_data_parallel_rank(self):
        return 0


class InferenceHead(Subject):
    framework = "deepspeed"
    name = "inference_head"
    description = ("legacy inference: deepspeed.init_inference(tensor_parallel tp_size) shards lm_head as "
                   "LmHeadLinearAllreduce (hidden shard, inference_all_reduce of partial logits); logits only.")
    axes = {"dtype": None, "vocab": None, "hidden": None, "tied": None, "bias": None, "head": None, "tp": None,
            "grain": None, "device": None, "tp_source": None}
    defaults = {"grain": INFERENCE_DEFAULT_GRAIN}
    clean_state = CLEAN_STATE

    def world_size(self, values):
        return values["tp"]

    def requires(self, values):
        return super().requires(values) + engine_dtype_requirements(values)

    def training_spec(self, values):
        return TrainingSpec(seed=case_seed(TrainingSpec.seed, values), steps=1, micro_batches=1)

    def claims(self, values):
        head = values["head"]
        return Claims(module_types={head: "LmHeadLinearAllreduce", "proj": "Linear", "embed_tokens": "Embedding"},
                      param_shards={f"{head}.weight": 1, f"{head}.bias": None},
                      micro_records={"logits": None})

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
        traj.put("logits", 0, 0, 0, None, logits)
        return traj

    def reset_process_state(self, ctx: RankContext) -> dict:
        setup_deepspeed(ctx)
        return reset_deepspeed_state()

    def run_rank(self, values, ctx):
        import deepspeed
        from deepspeed.comm import comm as ds_comm
        from deepspeed.inference.engine import InferenceEngine

        setup_deepspeed(ctx)
        tp = values["tp"]
        tp_rank, dp_rank = ctx.tp_dp(tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        model = build_model(spec, train.seed, dtype).to(ctx.device)
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        InferenceEngine.inference_mp_group = inference_group(ctx, tp)
        if values.get("tp_source", "tp_size") == "mpu":
            # The TP group a Megatron-style mpu hands over (inference/config.py:46, engine.py:113-115): the same
            # members as the group tp_size makes, so any difference is in how the group reaches the head.
            tensor_parallel = {"mpu": GroupMpu(InferenceEngine.inference_mp_group)}
        else:
            tensor_parallel = {"tp_size": tp}
        if values["grain"] != INFERENCE_DEFAULT_GRAIN:
            tensor_parallel["tp_grain_size"] = values["grain"]
        engine = deepspeed.init_inference(model, tensor_parallel=tensor_parallel, dtype=dtype,
                                          replace_with_kernel_inject=False,
                                          injection_policy={type(model): ("proj",)})
        obs.facts["module_types"] = {path: type(_attribute(engine.module, path)).__name__
                                     for path in self.claims(values).module_types}
        for name, p in engine.module.named_parameters():
            obs.record("weight", -1, None, name, p)
        reduces = []
        backend = ds_comm.cdb
        original = backend.inference_all_reduce

        def counted(tensor, *args, **kwargs):
            shm = hasattr(torch.ops, "deepspeed") and hasattr(torch.ops.deepspeed, "inference_all_reduce_")
            reduces.append("shm" if shm else "torch.distributed.all_reduce")
            if shm:  # the shm op is no torch.distributed call; it is still the head's one TP all-reduce
                counts[f"all_reduce@{tp}"] += 1
            return original(tensor, *args, **kwargs)

        backend.inference_all_reduce = counted
        try:
            batch = train.batches(0, dp_rank, spec.vocab, spec.ignore_index)[0]
            # Counted, not asserted: a head init_inference left replicated (a nested model.lm_head)
            # reduces nothing, and must show as a failed check beside logits that agree, not as a crash.
            with torch.no_grad(), collectives.recording() as counts:
                _, logits = engine(batch["input_ids"].to(ctx.device))
        finally:
            del backend.inference_all_reduce  # the instance attribute; the class method shows again
        obs.record("logits", 0, 0, None, logits)
        obs.facts["inference_all_reduce"] = reduces
        obs.facts["collectives"] = {(0, 0): dict(counts)}
        return obs


SUBJECTS = [InferenceHead()]
