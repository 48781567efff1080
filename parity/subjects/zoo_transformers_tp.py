"""transformers 5.24's own tensor parallelism (its tp_plan on DTensor) on the zoo's tiny architectures.

What a user of ``from_pretrained(dir, tp_plan="auto")`` gets: each rank saves the tiny model of references/zoo.py
(same seed, so the same weights on every rank and in the parent) with ``save_pretrained`` to a temporary directory
of its own and loads it with ``AutoModelForCausalLM.from_pretrained(dir, distributed_config=DistributedConfig(
tp_plan="auto", tp_size=tp))`` (the form of ``tp_plan="auto"`` that transformers 5.24 does not deprecate), which
builds the device mesh over the suite's gloo ranks, shards every parameter the model's plan names into a DTensor and
hooks the planned modules. The driver trains it with plain SGD on the DTensor parameters, the model's own forward
and loss_function. The reference is the same class loaded unsharded from the same checkpoint. Claims come from the
plan read off the built model (parity/subjects/zoo.py planned); details: docs/subjects.md#zoo-subjects.
"""
from __future__ import annotations

import functools
import tempfile
from importlib.util import find_spec

import torch

import parity.subjects.driver as driver  # the module, not the package: no import cycle
from parity.observe.dtypes import DTYPES
from parity.observe.observations import RankObservations
from parity.subjects.base import Claims, RankContext, Subject
from parity.subjects.driver import record_structure
from parity.subjects.plain_sgd import PlainSGD
from parity.subjects.torch_tp import TorchTPHead, _as_param, _grad_placements
from parity.subjects.zoo import (census_rows, freeze_other_towers, head_input_hook, hf_plan, model_inputs,
                                 move_media_ids, plan_style)
from references import zoo
from references.tiny_lm import ModelSpec
from references.trajectory import Trajectory, train_reference

AXES = {"arch": None, "vocab": (zoo.VOCAB,), "dtype": ("fp32", "bf16"), "gas": (2,), "tp": (2,), "device": ("cpu",)}
# transformers' styles (transformers/distributed/tensor_parallel.py, the ALL_PARALLEL_STYLES registrations) as the
# suite restates them from their docstrings: the dim of a parameter each shards, by parameter ("weight" of ndim n,
# "bias"); None: the parameter stays whole.
COLUMN = ("colwise", "colwise_gather_output", "colwise_rep")  # weight & bias -> Shard on the output features
ROW = ("rowwise", "rowwise_split_input", "rowwise_rep")  # weight -> Shard on the input features, bias replicated
EMBEDDING = {"embedding_rowwise": 0, "embedding_colwise": 1}  # the vocabulary rows or the hidden columns
# Fused weights split in strides (transformers' _StridedShard: each packed half chunked on its own), which the
# suite's "chunk" split does not describe: their values are compared gathered (full_tensor), their layout unclaimed.
STRIDED = ("packed_colwise", "packed_rowwise")


def _save(values, seed: int, directory: str) -> None:
    """The checkpoint a user would hold: the zoo's tiny model in fp32 from ``seed``, its media ids moved past the
    vocabulary (parity/subjects/zoo.py move_media_ids), written by save_pretrained."""
    model = zoo.build(values["arch"], torch.float32, seed)
    move_media_ids(model)
    model.save_pretrained(directory)


def _load(directory: str, dtype: torch.dtype, tp: int | None):
    """from_pretrained at ``dtype``; with ``tp``, transformers' tensor parallelism over the initialized process
    group. Then what a user fine-tuning the text side does: other towers frozen, training mode."""
    from transformers import AutoModelForCausalLM

    kwargs = {}
    if tp is not None:
        from transformers.distributed import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(tp_plan="auto", tp_size=tp)
    # Eager attention and experts, as the zoo builds them: the float64 oracle's matmuls take no grouped_mm.
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="eager",
                                                 experts_implementation="eager", **kwargs)
    if hasattr(model, "set_default_language") and getattr(model.config, "languages", None):
        model.set_default_language(model.config.default_language or model.config.languages[0])
    freeze_other_towers(model)
    model.train()
    return model


def loaded(values, seed: int, dtype: torch.dtype, tp: int | None):
    """The tiny model saved and loaded back. Under TP one checkpoint for every rank, as a user has it: rank 0 writes it
    (save_pretrained writes on global rank 0 alone once a process group is up: should_save_on_this_rank) into a
    directory it names to the others, every rank loads it, rank 0 removes it after a barrier."""
    import shutil

    import torch.distributed as dist

    if tp is None:
        with tempfile.TemporaryDirectory(prefix=f"zoo_transformers_tp-{values['arch']}-") as directory:
            _save(values, seed, directory)
            return _load(directory, dtype, None)
    name = [tempfile.mkdtemp(prefix=f"zoo_transformers_tp-{values['arch']}-") if dist.get_rank() == 0 else None]
    if dist.get_rank() == 0:
        _save(values, seed, name[0])
    dist.broadcast_object_list(name, src=0)
    try:
        return _load(name[0], dtype, tp)
    finally:
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(name[0], ignore_errors=True)


def style_dim(style: str | None, param: str, ndim: int) -> int | None | str:
    """The dim ``style`` shards a parameter named ``param`` (its last dotted part) of ``ndim`` dims along; None:
    whole; "strided": a packed style (STRIDED)."""
    if style in STRIDED:
        return "strided"
    if style in COLUMN:
        return 0 if ndim == 1 else ndim - 2
    if style in ROW:
        return None if param == "bias" else ndim - 1
    return EMBEDDING.get(style)


@functools.lru_cache(maxsize=None)
def layout(arch: str) -> dict:
    """Read off the built fp32 model: each parameter's style by the plan (a parameter's own entry, else its module's:
    transformers' _get_parameter_plan), the dim it is sharded along, its module's path, and the head and embedding."""
    model = zoo.build(arch)
    freeze_other_towers(model)
    plan = hf_plan(model)
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    modules = dict(model.named_modules())
    canonical = {id(p): n for n, p in model.named_parameters()}
    params = {}
    for name, p in model.named_parameters(remove_duplicate=False):  # a tied head's weight under its own name too
        module_path, _, leaf = name.rpartition(".")
        style = plan_style(plan, name) or plan_style(plan, module_path)
        params[name] = {"style": style, "dim": style_dim(style, leaf, p.dim()), "module": module_path,
                        "canonical": canonical[id(p)] == name, "trained": p.requires_grad}
    traits = zoo.traits(model)
    return {"params": params, "plan": plan, "head": zoo._module_path(model, head),
            "embedding": zoo._module_path(model, emb), "emb_class": type(emb).__name__,
            "head_class": type(head).__name__, "tied": head is not None and head.weight is emb.weight,
            "head_bias": getattr(head, "bias", None) is not None,
            "module_classes": {n: type(m).__name__ for n, m in modules.items()},
            "logits_from_head": not (traits["softcap"] or traits["logit_scale"] not in (None, 1)
                                     or traits["logits_scaling"] not in (None, 1))}


def _placement(dim) -> str:
    return f"(Shard(dim={dim}),)"


def module_type(module) -> str:
    return TorchTPHead.module_type(module)


def _view(t):
    """What a rank records of a tensor it holds: a DTensor's local shard; a strided one gathered whole."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    if any(type(p).__name__ == "_StridedShard" for p in t.placements):
        return t.full_tensor()
    return t.to_local()


class TrainedUpdate(driver.PlainUpdate):
    """PlainUpdate over the parameters that require grad (as the reference's SGD); a frozen tower's weights are
    recorded beside them, whole, at the start and after every step (the reference records every weight)."""

    def __init__(self, model, dtype, lr, **hooks):
        named = dict(model.named_parameters())
        params = {n: p for n, p in named.items() if p.requires_grad}
        super().__init__(model, params, PlainSGD(params, dtype, lr), **hooks)
        self.frozen = {n: p for n, p in named.items() if not p.requires_grad}

    def _record_frozen(self, step: int) -> None:
        for name, p in self.frozen.items():
            self.obs.record("weight", step, None, name, self.view(p))

    def start(self, run) -> None:
        super().start(run)
        self._record_frozen(-1)

    def end_step(self, step: int) -> None:
        super().end_step(step)
        self._record_frozen(step)


class ZooTransformersTP(Subject):
    name = "zoo_transformers_tp"
    framework = "transformers"
    feature = None  # the head is whatever the architecture's plan makes it: no one row of the frameworks table
    description = ("A transformers architecture built tiny (arch), saved and loaded with from_pretrained(tp_plan="
                   "'auto') on the gloo ranks: transformers' own DTensor tensor parallelism from the model's plan, its "
                   "own forward and loss_function, plain SGD on the DTensor parameters; claims from the plan.")
    axes = AXES
    defaults = {"vocab": zoo.VOCAB}
    reference_imports = ("transformers.models.auto.modeling_auto",)
    # What from_pretrained swaps for its duration and two loads at once leave swapped
    # (findings/transformers_from_pretrained_threads_leave_globals.toml), as reset_process_state reports it.
    clean_state = {"default_dtype": "torch.float32", "tie_weights": "PreTrainedModel.tie_weights",
                   "init_weights": "PreTrainedModel.init_weights"}

    def reset_process_state(self, ctx) -> dict:
        """Reported, not put back (the originals are gone once replaced): a rank loads one model at a time, so a
        replaced one fails the next case's process_state_reset check by name."""
        from transformers.modeling_utils import PreTrainedModel

        return {"default_dtype": str(torch.get_default_dtype()),
                "tie_weights": PreTrainedModel.tie_weights.__qualname__,
                "init_weights": PreTrainedModel.init_weights.__qualname__}

    def world_size(self, values):
        return values["tp"]

    def records_master_weights(self, values: dict) -> bool:
        return PlainSGD.keeps_masters(DTYPES[values["dtype"]])

    def unavailable_reason(self, values):
        """transformers and accelerate (from_pretrained refuses a tp_plan without it: it sets a device_map,
        transformers/integrations/accelerate.py check_and_set_device_map), and an architecture that builds here."""
        reason = super().unavailable_reason(values)
        if reason is None and find_spec("transformers") is None:
            reason = "transformers is not installed (pip install -e '.[hf]')"
        if reason is None and find_spec("accelerate") is None:
            reason = ("accelerate is not installed: transformers' from_pretrained(tp_plan=...) requires it "
                      "(transformers/integrations/accelerate.py check_and_set_device_map); pip install -e '.[hf]'")
        row = census_rows().get(values["arch"])
        if reason is None and row is not None and row["status"] != "built":
            reason = f"{values['arch']} cannot be built here (docs/zoo-census.md): {row['reason']}"
        return reason

    # -- the model ------------------------------------------------------------------------------------
    def model_spec(self, values):
        info = layout(values["arch"])
        return ModelSpec(vocab=values["vocab"], hidden=0, bias=info["head_bias"], head_name=info["head"],
                         tied=info["tied"])

    def build(self, values: dict, dtype: torch.dtype):
        """The reference's model: the same checkpoint loaded unsharded."""
        return loaded(values, self.training_spec(values).seed, dtype, None)

    def reference(self, values: dict, compute_dtype=None) -> Trajectory:
        """The same class unsharded: its own forward and its own loss (labels passed)."""
        def forward(model, batch, num_items):
            out = model(**model_inputs(model, batch))
            return out.loss, out.logits

        return train_reference(self.model_spec(values), self.training_spec(values), DTYPES[values["dtype"]],
                               compute_dtype, build=lambda dtype: self.build(values, dtype), forward=forward,
                               capture=self.capture_head_input)

    capture_head_input = staticmethod(head_input_hook)

    # -- ranks ----------------------------------------------------------------------------------------
    def run_rank(self, values: dict, ctx: RankContext) -> RankObservations:
        tp = values["tp"]
        if ctx.world_size != tp:
            raise ValueError(f"{self.name} runs with world size == tp; got world {ctx.world_size}, tp {tp}")
        tp_rank, dp_rank = ctx.tp_dp(tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        model = loaded(values, train.seed, dtype, tp)
        captured: dict = {}
        self.capture_head_input(model, captured)
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        record_structure(obs, model, self.claims(values), module_type)
        update = TrainedUpdate(model, dtype, train.lr, grad_of=lambda p: _as_param(p.grad, p),
                               step_facts=_grad_placements)

        def forward(batch, num_items):
            out = model(**model_inputs(model, batch))
            return out.loss, out.logits

        return driver.train(driver.Run(obs, train, forward, update, driver.lm_batches(train, spec, dp_rank, ctx.device),
                                       spec.reduction, captured=captured, view=_view))

    # -- what transformers must build ------------------------------------------------------------------
    def claims(self, values):
        """Each parameter the plan shards on the dim its style names (torch.chunk's split: DTensor's Shard), the
        rest whole; each sharded module's class with its weight's placement; the head and a tied embedding."""
        info = layout(values["arch"])
        shards, types = {}, {}
        for name, p in info["params"].items():
            if p["dim"] == "strided":
                continue  # compared gathered (_view); the suite has no formula for a strided layout
            if p["canonical"] and p["trained"]:  # a frozen tower's weights are recorded whole, not trained
                shards[name] = p["dim"]
            if name.endswith(".weight") and p["module"]:
                cls = info["module_classes"][p["module"]]
                types[p["module"]] = cls + (_placement(p["dim"]) if p["dim"] is not None else "")
        head, emb = info["head"], info["embedding"]
        tied = ((f"{head}.weight", f"{emb}.weight"),) if info["tied"] else ()
        return Claims(module_types=types, param_shards=shards, split="chunk", shared_params=tied,
                      logits_from_head=info["logits_from_head"])
