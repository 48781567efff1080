"""Strategy families for `parity explore --strategy NAME`: points drawn from what users write, not from the axes.

axes (the default) draws every subject's axes over their whole domains (domains.points). The other families
draw a user's input and map it onto the subjects' declared axes, so every drawn point is still a case a case
file makes (its entry printable, its twin and marks found as for any explored case):

- configs: a DeepSpeed config written key by key from DeepSpeed's own schema (its pydantic models and the
  runtime/config.py readers), each key left out (DeepSpeed's default) or given one of the schema's values,
  ints at their documented limits; CONFIG_GROUPS says which axis carries each value.
- calls: an entry point on the head/loss path and its arguments, from its signature (ENTRY_POINTS): each
  optional argument left out or given, every dtype, the autocast mix where the subject has one.
- structures: where the head lives and what it is tied to (STRUCTURE_AXES), crossed with the partition specs
  the config carries, at small sizes.
- topologies: a world larger than tp on every subject that has an axis for it (dp, sp, an earlier
  init_inference's tp, a checkpoint's saving tp), tp up to 8.

A value no axis carries is not drawn: configs_census() and calls_census() list each with why, and the tests
hold them complete against the installed DeepSpeed's schema and signatures, so a new key or argument fails a
test by name instead of going unexplored.
"""
from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import dataclass, field
from enum import Enum

from hypothesis import strategies as st

from parity.axes import AXES
from parity.explore.domains import HELD_AXES, NOT_EXPLORED, RANGES, _choices, default_of, points as axes_points
from parity.subjects import SUBJECTS

ABSENT = "<left out>"


def _accepts(subject_name: str, axis: str, value) -> bool:
    """Whether the subject declares the axis and takes this value on it."""
    if axis not in SUBJECTS[subject_name].axes:
        return False
    allowed = SUBJECTS[subject_name].axes[axis]
    if allowed is None:
        return AXES[axis].accepts(value)
    return any(type(value) is type(v) and value == v for v in allowed)


def _draw_int(draw, axis: str, allowed, lo: int, hi: int):
    if allowed is None:
        return draw(st.integers(lo, max(lo, hi)))
    return draw(st.sampled_from(sorted(v for v in allowed if lo <= v <= hi) or [min(allowed)]))


@st.composite
def _axes(draw, name: str, free, max_world: int, fixed: dict | None = None, min_spread: int = 1):
    """The subject's axes: those in free drawn over their domains (held axes held), fixed ones as given, the rest at
    their defaults. min_spread: the least dp / sp drawn (2: a world larger than tp)."""
    subject, fixed, values = SUBJECTS[name], fixed or {}, {}
    spread = [a for a in ("dp", "sp") if a in subject.axes]
    for axis, allowed in subject.axes.items():
        if axis in fixed:
            values[axis] = fixed[axis]
        elif axis in HELD_AXES:
            values[axis] = HELD_AXES[axis][0]
        elif axis not in free:
            default = default_of(name, axis)  # or, where the subject does not take it (uc_*: ZeRO 1-2), its first
            values[axis] = default if _accepts(name, axis, default) else (
                _choices(name, axis)[0] if AXES[axis].values is not None or allowed is None else min(allowed))
        elif axis in ("tp", "save_tp"):
            values[axis] = _draw_int(draw, axis, allowed, 2, min(RANGES[axis][1], max_world // min_spread))
        elif axis in ("dp", "sp"):
            room = max(1, max_world // values["tp"])
            low = min_spread if axis == spread[0] else 1
            values[axis] = _draw_int(draw, axis, allowed, min(low, room), min(RANGES[axis][1], room))
        elif axis in RANGES:
            values[axis] = _draw_int(draw, axis, allowed, *RANGES[axis])
        else:
            values[axis] = draw(st.sampled_from(_choices(name, axis)))
    return values


SCALE = {"vocab", "hidden", "tp", "gas"}


# ---------------------------------------------------------------------------------------------- configs

@dataclass(frozen=True)
class ConfigGroup:
    """Config keys written together as one choice: alternatives (config fragment, axis values), the first the
    keys left out. A fragment's values come from the schema (schema: where DeepSpeed declares the key)."""
    keys: tuple
    schema: str
    alternatives: tuple
    uncarried: tuple = ()  # (value, why no axis carries it)


def _schema_field(ref: str):
    module, _, rest = ref.partition(":")
    model, _, name = rest.partition(".")
    return getattr(importlib.import_module(module), model).model_fields[name]


def schema_values(ref: str, axis_range=None) -> tuple:
    """Every value DeepSpeed's pydantic field takes, for a closed type: bool, Literal, Enum, Optional of them; an int
    at its documented limits: its Ge/Gt bound (or 0) and default, and, given axis_range, the axis's ends."""
    f = _schema_field(ref)
    tp, values = f.annotation, []
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp, values = args[0], [None]
    if tp is bool:
        return tuple([False, True] + values)
    if typing.get_origin(tp) is typing.Literal:
        return tuple(list(typing.get_args(tp)) + values)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tuple([m.value for m in tp] + values)
    if tp is int:
        low = next((getattr(m, "ge", None) or getattr(m, "gt", None) for m in f.metadata), 0)
        ints = {low, f.default} | (set(axis_range) if axis_range else set())
        return tuple(sorted(ints) + values)
    raise TypeError(f"{ref}: no closed set of values for {tp!r}")


def _field_group(path: str, ref: str, to_axes, axis_range=None) -> ConfigGroup:
    """One key: left out, or each schema value; to_axes(value) -> axis values, or a string saying why none."""
    alternatives, uncarried = [(ABSENT, to_axes(ABSENT))], []
    for v in schema_values(ref, axis_range):
        carried = to_axes(v)
        (uncarried.append((v, carried)) if isinstance(carried, str) else alternatives.append((v, carried)))
    return ConfigGroup((path,), ref, tuple(alternatives), tuple(uncarried))


def _switch(axis: str, on=True, off=False, absent=None):
    def to_axes(v):
        if v is ABSENT:
            return {} if absent is None else {axis: absent}
        if v is None:
            return "None: DeepSpeed reads it as left out, which the alternative without the key draws"
        return {axis: on if v else off}
    return to_axes


# tp_grain_size (an int without a bound in the schema): its default and the grain axis's ends (64: init_inference's
# default), with the interior grains where a near-even split turns uneven at the suite's vocabularies.
GRAIN_POINTS = (RANGES["grain"][0], 2, 5, 16, RANGES["grain"][1])
TP_CONFIG = "deepspeed.runtime.tensor_parallel.config"
PRECISION = "deepspeed.runtime.precision_config"
ZERO = "deepspeed.runtime.zero.config:DeepSpeedZeroConfig"


def config_groups() -> list:
    """The config keys the configs family writes, from the installed DeepSpeed's schema (imports DeepSpeed)."""
    def stage(v):
        return {} if v is ABSENT else {"zero": int(v)}

    def grain(v):
        if v is ABSENT:
            return {}
        return {"grain": v} if v >= 1 else f"tp_grain_size {v}: no axis value (grain >= 1)"

    def vplm(v):
        return {"vocab_parallel_lm_head": "unset" if v in (ABSENT, None) else ("true" if v else "false")}

    def backend(v):
        return {} if v is ABSENT else {"backend": v}

    def uds(v):
        return {"use_default_specs": "unset" if v is ABSENT else ("true" if v else "false")}

    groups = [
        _field_group("zero_optimization.stage", f"{ZERO}.stage", stage),
        _field_group("tensor_parallel.tp.tp_grain_size", f"{TP_CONFIG}:TPConfig.tp_grain_size", grain, GRAIN_POINTS),
        _field_group("tensor_parallel.tp_overlap_comm", f"{TP_CONFIG}:TPTrainingConfig.tp_overlap_comm",
                     _switch("overlap")),
        _field_group("tensor_parallel.keep_module_on_host", f"{TP_CONFIG}:TPTrainingConfig.keep_module_on_host",
                     _switch("keep_on_host")),
        _field_group("tensor_parallel.vocab_parallel_ce_backend",
                     f"{TP_CONFIG}:TPTrainingConfig.vocab_parallel_ce_backend", backend),
        _field_group("tensor_parallel.vocab_parallel_lm_head", f"{TP_CONFIG}:TPTrainingConfig.vocab_parallel_lm_head",
                     vplm),
        _field_group("bf16.immediate_grad_update", f"{PRECISION}:DeepSpeedBF16Config.immediate_grad_update",
                     _switch("immediate_grad")),
        _field_group("bf16.check_grad_overflow", f"{PRECISION}:DeepSpeedBF16Config.check_grad_overflow",
                     _switch("overflow_check")),
        _field_group("bf16.bf16_master_weights_and_grads",
                     f"{PRECISION}:DeepSpeedBF16Config.bf16_master_weights_and_grads", _switch("bf16_master")),
    ]
    # Precision: one section enabled (both at once is DeepSpeed's refusal, which no axis carries).
    groups.append(ConfigGroup(("bf16.enabled", "fp16.enabled"), f"{PRECISION}:DeepSpeedBF16Config.enabled",
                              ((ABSENT, {"dtype": "fp32"}), ({"bf16": {"enabled": False}}, {"dtype": "fp32"}),
                               ({"bf16": {"enabled": True}}, {"dtype": "bf16"}),
                               ({"fp16": {"enabled": True}}, {"dtype": "fp16"})),
                              (("both enabled", "DeepSpeed refuses it at config parsing; no axis value"),)))
    # Keys runtime/config.py reads with get_* (no pydantic model): their documented values, each a dp_reduce value.
    groups.append(ConfigGroup(
        ("prescale_gradients", "gradient_predivide_factor", "communication_data_type"),
        "deepspeed.runtime.config:get_prescale_gradients/get_gradient_predivide_factor/get_communication_data_type",
        ((ABSENT, {"dp_reduce": "average"}), ({"prescale_gradients": True}, {"dp_reduce": "prescale"}),
         ({"gradient_predivide_factor": 2.0}, {"dp_reduce": "predivide2"}),
         ({"communication_data_type": "fp32"}, {"dp_reduce": "comm_fp32"}),
         ({"communication_data_type": "bf16"}, {"dp_reduce": "comm_bf16"})),
        (("communication_data_type fp16", "no axis value"), ("two of the keys at once", "no axis value"))))
    groups.append(ConfigGroup(
        ("gradient_clipping",), "deepspeed.runtime.constants:GRADIENT_CLIPPING_DEFAULT",
        ((ABSENT, {"clip": 0.0, "clip_key": "unset"}), (0.0, {"clip": 0.0}), (0.05, {"clip": 0.05}),
         (1.0, {"clip": 1.0})),
        (("other positive values", "the clip axis carries 0.05 (binds at every step) and 1.0 (the default)"),)))
    groups.append(ConfigGroup(
        ("data_types.grad_accum_dtype",), "deepspeed.runtime.config:get_data_types_params",
        ((ABSENT, {"grad_accum": "model"}), ("fp32", {"grad_accum": "fp32"})),
        (("bf16/fp16", "the model dtype's own accumulation is the key left out"),)))
    groups.append(ConfigGroup(
        ("tensor_parallel.partition_config.use_default_specs",), f"{TP_CONFIG}:TPTrainingConfig.partition_config",
        ((ABSENT, uds(ABSENT)), (False, uds(False)), (True, uds(True)))))
    return groups


# Schema fields of the sections the family writes that no group draws, and why (configs_census holds this complete).
CONFIG_NOT_DRAWN = {
    "TPTrainingConfig.dtype": "set by DeepSpeed from the precision section; the subject never writes it",
    "TPTrainingConfig.autotp_size": "the tp drawn (every case writes it)",
    "TPTrainingConfig.tensor_parallel": "its tp_grain_size is drawn; tp_size is the tp drawn",
    "TPTrainingConfig.injection_policy_tuple": "an inference-injection policy: no training head takes it",
    "TPTrainingConfig.partition_config": "its layer_specs are the subject's sharding (structures family); "
                                         "use_default_specs is drawn",
    "TPTrainingConfig.preset_model": "the preset_llama subject's own (structures family)",
    "TPTrainingConfig.replace_with_kernel_inject": "kernel injection is inference only (CUDA kernels)",
    "TPConfig.tp_size": "the tp drawn", "TPConfig.mpu": "a user's group: ds_reject user_tp_group_mpu",
    "TPConfig.tp_group": "a user's group: ds_reject user_tp_group_config",
    "DeepSpeedBF16Config.enabled": "drawn with fp16.enabled as one precision choice",
    "DeepSpeedBF16Config.bf16_optimizer_states": "written with bf16_master_weights_and_grads (the one accepted pair)",
    "DeepSpeedFP16Config.*": "fp16 on this CPU has no kernels (cases skip by name); the loss_scale axis covers "
                             "the dynamic scaler on GPU machines",
    "DeepSpeedZeroConfig.*": "buckets, offload, prefetch and persistence thresholds change no number the suite "
                             "checks at its sizes (every bucket holds the whole model); stage is drawn",
}

CONFIG_SUBJECTS = ("column_gathered", "vocab_parallel", "row_parallel", "tied_vocab_parallel", "tied_row_parallel",
                   "tied_column_gathered", "embed_spec_untied", "preset_llama", "heuristic_blocks", "tied_plan_head")


def _fits(name: str, axes: dict) -> bool:
    return all(_accepts(name, a, v) and a not in HELD_AXES for a, v in axes.items())


def _set(config: dict, path: str, value):
    *parents, leaf = path.split(".")
    for p in parents:
        config = config.setdefault(p, {})
    config[leaf] = value


@st.composite
def config_points(draw, subjects, max_world: int, groups):
    """(subject, axis values, the config drawn): each group left out or given a schema value the subject carries."""
    name = draw(st.sampled_from(subjects))
    config, fixed = {}, {}
    for g in groups:
        choices = [a for a in g.alternatives if _fits(name, a[1]) and all(k not in fixed for k in a[1])]
        if not choices:
            continue
        fragment, axes = draw(st.sampled_from(choices))
        fixed.update(axes)
        if fragment is ABSENT:
            continue
        if isinstance(fragment, dict):
            for k, v in fragment.items():
                (config.setdefault(k, {}).update(v) if isinstance(v, dict) else config.__setitem__(k, v))
        else:
            _set(config, g.keys[0], fragment)
    values = draw(_axes(name, SCALE | {"dp"}, max_world, fixed))
    config.setdefault("tensor_parallel", {})["autotp_size"] = values["tp"]
    return name, values, {"config": config}


def configs_census() -> dict:
    """Every field of the schema sections the family writes -> what draws it ("drawn: <key>") or why not."""
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.tensor_parallel.config import TPConfig, TPTrainingConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    drawn = {g.schema.split(":")[1]: g.keys for g in config_groups() if g.schema.count(":") == 1}
    out = {}
    for model in (TPTrainingConfig, TPConfig, DeepSpeedBF16Config, DeepSpeedFP16Config, DeepSpeedZeroConfig):
        for f in model.model_fields:
            key = f"{model.__name__}.{f}"
            out[key] = (f"drawn: {', '.join(drawn[key])}" if key in drawn else
                        CONFIG_NOT_DRAWN.get(key) or CONFIG_NOT_DRAWN.get(f"{model.__name__}.*"))
    return out


# ------------------------------------------------------------------------------------------------ calls

@dataclass(frozen=True)
class EntryPoint:
    """A public function a user calls, the subject that calls it, and each parameter: the axis that draws it (its
    default first: the argument left out, or what a user passes by habit), or why none does."""
    target: str
    subject: str
    params: dict = field(default_factory=dict)


_GROUP = "the subject's TP group (tp drawn); another group is ds_reject user_tp_group_* or mutant liger_no_tp_group"
_BOUNDS = ("given: the shard's bounds, required for an uneven split; left out: ds_reject ce_uneven_no_bounds, "
           "ce_start_without_end")
CE = "deepspeed.sequence.cross_entropy"
OPS = "deepspeed.sequence.vocab_parallel_ops"
ENTRY_POINTS = (
    EntryPoint(f"{CE}:vocab_parallel_cross_entropy", "ds_vocab_ce", {
        "vocab_parallel_logits": ("dtype", "vocab", "inf_rows"), "target": ("ignore", "targets"), "tp_group": "tp",
        "sp_group": ("sp", "sp_chunks"), "vocab_start_index": _BOUNDS, "vocab_end_index": _BOUNDS,
        "global_vocab_size": "global_vocab", "ignore_index": "ignore_index", "reduction": "reduction",
        "gather_sequence_loss": "seq_gather", "backend": "ds_liger_ce calls it with backend='liger'"}),
    EntryPoint(f"{CE}:vocab_parallel_cross_entropy", "ds_liger_ce", {
        "vocab_parallel_logits": ("dtype", "vocab"), "target": "ignore", "tp_group": "tp",
        "sp_group": "ds_vocab_ce draws it", "vocab_start_index": _BOUNDS, "vocab_end_index": _BOUNDS,
        "global_vocab_size": "global_vocab", "ignore_index": "ds_vocab_ce draws it",
        "reduction": "ds_vocab_ce draws it", "gather_sequence_loss": "ds_vocab_ce draws it",
        "backend": ("triton", "backward")}),
    EntryPoint(f"{CE}:vocab_sequence_parallel_cross_entropy", "ds_vocab_seq_ce", {
        "vocab_parallel_logits": ("dtype", "vocab"), "target": "ignore", "sp_group": ("sp", "sp_chunks"),
        "tp_group": "tp", "vocab_start_index": _BOUNDS, "vocab_end_index": _BOUNDS,
        "ignore_index": "ds_vocab_ce draws it", "reduction": "reduction", "gather_sequence_loss": "seq_gather",
        "backend": "ds_liger_ce draws the liger backend"}),
    EntryPoint(f"{CE}:VocabParallelCrossEntropyLoss.__init__", "ds_vocab_ce_module", {
        "tp_group": "tp", "sp_group": "ds_vocab_ce draws it", "vocab_start_index": _BOUNDS,
        "vocab_end_index": _BOUNDS, "ignore_index": "ignore_index", "reduction": "reduction",
        "gather_sequence_loss": "ds_vocab_ce draws it", "backend": ("backend", "triton")}),
    EntryPoint(f"{CE}:VocabParallelCrossEntropyLoss.forward", "ds_vocab_ce_module", {
        "vocab_parallel_logits": ("dtype", "vocab"), "target": "ignore"}),
    EntryPoint(f"{OPS}:vocab_parallel_logprobs", "ds_vocab_logprobs", {
        "vocab_parallel_logits": ("dtype", "vocab", "inf_rows"), "index": ("topk", "ignore"), "tp_group": "tp",
        "vocab_start_index": _BOUNDS, "vocab_end_index": _BOUNDS,
        "global_vocab_size": "left out (the subject's shards are the near-even split it infers)",
        "ignore_index": "left out: -100, the ignore axis's id"}),
    EntryPoint(f"{OPS}:vocab_parallel_entropy", "ds_vocab_entropy", {
        "vocab_parallel_logits": ("dtype", "vocab", "inf_rows"), "tp_group": "tp"}),
    EntryPoint(f"{OPS}:vocab_parallel_kl_div", "ds_vocab_kl", {
        "student_logits": ("dtype", "vocab", "kl_grad", "inf_rows"), "teacher_logits": ("kl_grad", "kl_shards"),
        "reverse": "reverse", "tp_group": "tp"}),
    EntryPoint("deepspeed.sequence.linear_cross_entropy:vocab_parallel_linear_cross_entropy", "ds_fused_linear_ce", {
        "hidden": ("dtype", "autocast"), "weight": "vocab", "target": "ignore", "bias": "bias", "tp_group": "tp",
        "sp_group": "sp", "vocab_start_index": _BOUNDS, "vocab_end_index": _BOUNDS,
        "ignore_index": "left out: -100, the ignore axis's id", "reduction": "reduction", "chunk_size": "chunk"}),
    EntryPoint("liger_kernel.ops.vocab_parallel_cross_entropy:LigerVocabParallelCEFunction.forward", "liger_vocab_ce", {
        "ctx": "autograd's", "vocab_parallel_logits": ("dtype", "vocab", "backward"), "target": ("ignore", "targets"),
        "tp_group": "tp", "ignore_index": "-100, the ignore axis's id", "label_smoothing": "label_smoothing",
        "label_smoothing_formula": "ls_formula", "label_smoothing_mode": "ls_mode"}),
    EntryPoint("deepspeed:init_inference", "inference_head", {
        "model": ("tied", "bias", "head", "hidden", "head_input"),
        "config": ("tp", "dtype", "grain", "tp_source", "allreduce", "prior_tp"),
        "kwargs": "the same keys as config (DeepSpeed merges them): config is drawn"}),
    EntryPoint("deepspeed:tp_model_init", "vocab_parallel", {
        "model": "vocab", "tp_size": "tp", "dtype": "dtype", "config": ("model_init", "zero"),
        "kwargs": "the same keys as config: config is drawn"}),
)
# model_init through tp_model_init only: zero_init needs ZeRO 3, zero_init_dtype is a documented divergence on a CPU
# without fp16 (HELD_AXES["model_init"]); the calls family draws plain and tp_model_init.
CALL_RELEASED = {"model_init": ("plain", "tp_model_init")}


def _callable(target: str):
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def calls_census() -> dict:
    """Every parameter of every entry point (the installed signatures) -> the axes that draw it, or why none."""
    out = {}
    for e in ENTRY_POINTS:
        for p in inspect.signature(_callable(e.target)).parameters:
            if p == "self":
                continue
            out[f"{e.target}({p}) [{e.subject}]"] = e.params.get(p)
    return out


def call_axes(subject: str) -> set:
    found = set()
    for e in ENTRY_POINTS:
        if e.subject == subject:
            for v in e.params.values():
                if isinstance(v, tuple):
                    found |= set(v)
                elif v in AXES:
                    found.add(v)
    return found & set(SUBJECTS[subject].axes)


CALL_SUBJECTS = tuple(dict.fromkeys(e.subject for e in ENTRY_POINTS))


@st.composite
def call_points(draw, subjects, max_world: int):
    name = draw(st.sampled_from(subjects))
    fixed = {}
    for axis, allowed in CALL_RELEASED.items():
        if axis in SUBJECTS[name].axes:
            fixed[axis] = draw(st.sampled_from([v for v in allowed if _accepts(name, axis, v)]))
    values = draw(_axes(name, call_axes(name) | SCALE, max_world, fixed))
    return name, values, {"call": next(e.target for e in ENTRY_POINTS if e.subject == name)}


# ------------------------------------------------------------------------------------------- structures

# What a user's model looks like around its head, and the partition specs a config carries for it.
STRUCTURE_AXES = {"head", "tied", "bias", "second_head", "embed_spec", "use_default_specs", "vocab_parallel_lm_head",
                  "padding", "head_input", "embed_scale", "hf_head"}
STRUCTURE_SUBJECTS = tuple(n for n, s in SUBJECTS.items() if n not in NOT_EXPLORED and not n.startswith(("_", "zoo"))
                           and any(a in s.axes and (s.axes[a] is None or len(s.axes[a]) > 1 or a == "head")
                                   for a in ("head", "tied", "second_head", "embed_spec", "vocab_parallel_lm_head",
                                             "hf_head")))


@st.composite
def structure_points(draw, subjects, max_world: int):
    name = draw(st.sampled_from(subjects))
    return name, draw(_axes(name, STRUCTURE_AXES | SCALE, max_world)), {}


# ------------------------------------------------------------------------------------------- topologies

# The axes that decide what a world larger than tp does (dp or sp makes it larger).
TOPOLOGY_AXES = {"dp", "sp", "sp_chunks", "prior_tp", "save_tp", "zero", "dp_reduce"}
TOPOLOGY_SUBJECTS = tuple(n for n, s in SUBJECTS.items() if n not in NOT_EXPLORED and not n.startswith("_")
                          and any(a in s.axes for a in ("dp", "sp")))


@st.composite
def topology_points(draw, subjects, max_world: int):
    name = draw(st.sampled_from(subjects))
    axes = SUBJECTS[name].axes
    # Every subject of the family has dp or sp (the uc_* subjects' save_tp and inference_head's prior_tp come with
    # a dp axis), the first of which is drawn >= 2: the world is larger than tp at every point.
    return name, draw(_axes(name, TOPOLOGY_AXES | SCALE, max_world, min_spread=2)), {}


# ------------------------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Family:
    name: str
    help: str
    subjects: tuple  # its default subjects (None: every explorable subject)
    points: typing.Callable  # (subjects, max_world) -> strategy of (name, values, user input)
    max_world: int  # its default --max-world


def _axes_family_points(subjects, max_world):
    return axes_points(subjects, max_world).map(lambda p: (*p, {}))


FAMILIES = {f.name: f for f in [
    Family("axes", "every subject's axes over their whole domains", None, _axes_family_points, 4),
    Family("configs", "a DeepSpeed config from its own schema: each key left out or given a schema value",
           CONFIG_SUBJECTS, lambda subjects, mw: config_points(subjects, mw, config_groups()), 4),
    Family("calls", "an entry point's arguments from its signature: each left out or given, every dtype",
           CALL_SUBJECTS, call_points, 4),
    Family("structures", "head names, nesting, ties, second heads and wrappers, with the partition specs",
           STRUCTURE_SUBJECTS, structure_points, 4),
    Family("topologies", "a world larger than tp (dp, sp, an earlier init_inference, a saving tp), tp up to 8",
           TOPOLOGY_SUBJECTS, topology_points, 8),
]}


def no_wider_world() -> list:
    """The explorable subjects the topologies family cannot reach: their call or model runs on the TP group alone (no
    axis gives them ranks beyond tp)."""
    return [n for n in SUBJECTS if n not in NOT_EXPLORED and not n.startswith("_") and n not in TOPOLOGY_SUBJECTS]
