"""DeepSpeed 0.19.8 AutoTP output heads, driven the way users drive them: through deepspeed.initialize.

DeepSpeed is imported only inside rank processes, so listing and collecting cases stays fast and
works without it. How DeepSpeed decides what these heads check: docs/subjects.md#engine-heads
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import re
import types
from importlib.util import find_spec
from unittest import mock

import torch

from parity.observe import collectives
from parity.observe.observations import RankObservations
from parity.observe.partition import shard_sizes
from parity.observe.process_functions import functional_linear
import parity.subjects.loss_scaling as loss_scaling  # the module, not the package: no import cycle
import parity.subjects.driver as driver  # the module, not the package: no import cycle
from parity.subjects.base import NAMED_HEADS, RankContext, Subject, head_claims
from parity.subjects.driver import attribute, record_structure
from parity.observe.dtypes import DTYPES
from references.model_config import hf_like_config, text_kv_heads
from references.tiny_lm import build_model, capture_head_input_and_grad

COMMON_AXES = {
    "dtype": None, "reduction": None, "vocab": None, "hidden": None, "bias": None, "head": NAMED_HEADS,
    "ignore": None, "zero": None, "gas": None, "tp": None, "dp": None, "grain": None, "clip": None,
    "device": None, "dp_reduce": None, "grad_accum": None, "autocast": None,
}
# tensor_parallel.tp_overlap_comm and the bf16 section's switches (issue 13): on the two column heads only.
SWITCH_AXES = {"overlap": None, "immediate_grad": None, "overflow_check": None, "bf16_master": None, "keep_on_host": None,
               "loss_scale": None}
# The torch_autocast dtype each autocast value configures (DeepSpeed's config spelling).
AUTOCAST_CONFIG = {"bf16": "bfloat16", "fp16": "float16"}
# torch_autocast.lower_precision_safe_modules: on the three heads whose AutoTP class a user can name.
AUTOCAST_MODULES_AXES = {"autocast_modules": None}
# AutoTP's classes by the base a user names for every layer of that kind (module_inject/layers.py: VocabParallelLinear
# subclasses LinearLayer, LinearAllreduceWithReplicatedInput subclasses LinearAllreduce).
AUTOTP_BASE_CLASS = {"LinearLayer": "LinearLayer", "VocabParallelLinear": "LinearLayer",
                     "LinearAllreduceWithReplicatedInput": "LinearAllreduce"}
# proj's spec in every partition_config of the engine heads: the tiny LM's hidden projection stays replicated.
SKIP_PROJ = {"patterns": [r"proj\.weight$"], "partition_type": "skip"}
# The DeepSpeed config keys each dp_reduce value sets (parity/axes.py says what each means).
DP_REDUCE_CONFIG = {"average": {}, "prescale": {"prescale_gradients": True},
                    "predivide2": {"gradient_predivide_factor": 2.0}, "comm_fp32": {"communication_data_type": "fp32"},
                    "comm_bf16": {"communication_data_type": "bf16"}}


def setup_deepspeed(ctx: RankContext) -> None:
    """Once per rank process: join DeepSpeed's comm layer to the process group the worker made."""
    if "deepspeed" in ctx.state:
        return
    # The CPU shm all-reduce op is not built here (its JIT build is slow; training never calls it); DeepSpeed's
    # own builder is kept for the shm cases. Why: docs/subjects.md#deepspeeds-cpu-shm-op
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    build_shm_op, comm_torch.build_shm_op = comm_torch.build_shm_op, lambda: None
    import deepspeed

    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend=dist.get_backend())  # joins the worker's process group
    ctx.state["deepspeed"] = {"tp_groups": {}, "build_shm_op": build_shm_op}


def install_tp_groups(ctx: RankContext, tp: int, dist_debug: str = "off") -> None:
    """Install DeepSpeed's (dp, tp) module-global groups for this case, built once per process per TP size and
    debug mode (docs/subjects.md#group-setup-under-detail-debugging)."""
    from deepspeed.utils import groups

    cache = ctx.state["deepspeed"]["tp_groups"]
    names = ("_TENSOR_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP")
    key = tp if dist_debug == "off" else (tp, dist_debug)
    if key not in cache:
        for n in names:
            setattr(groups, n, None)
        if dist_debug == "off":
            groups._init_tp_mesh_device(tensor_model_parallel_size=tp)
        else:
            _init_groups_under_detail(groups, tp)
        cache[key] = tuple(getattr(groups, n) for n in names)
    for n, g in zip(names, cache[key]):
        setattr(groups, n, g)


def _init_groups_under_detail(groups, tp: int) -> None:
    import torch.distributed as dist

    saved_env, saved_level = os.environ.get("TORCH_DISTRIBUTED_DEBUG"), dist.get_debug_level()
    built, original = [], groups._init_tp_groups_with_new_group

    def new_group_path(*args, **kwargs):
        built.append(True)
        return original(*args, **kwargs)

    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        with mock.patch.object(groups, "_init_tp_groups_with_new_group", new_group_path):
            groups._init_tp_mesh_device(tensor_model_parallel_size=tp)
    finally:
        dist.set_debug_level(saved_level)
        if saved_env is None:
            os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
        else:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = saved_env
    if not built:  # the case would pass on the default path and prove nothing about DETAIL's
        raise RuntimeError("TORCH_DISTRIBUTED_DEBUG=DETAIL did not reach DeepSpeed's group setup "
                           "(utils/groups.py no longer takes its new_group path for it)")


def reset_deepspeed_state() -> dict:
    """Process-global AutoTP state a previous case may have left behind (deepspeed-autotp.md)."""
    from deepspeed.module_inject import layers
    from deepspeed.runtime.tensor_parallel import init_utils
    from deepspeed.utils import groups

    from deepspeed.runtime import torch_autocast

    layers.set_autotp_mode(training=False)
    # tp_model_init's record is module-global and DeepSpeed never clears it: a later initialize would
    # merge a stale tp_size / tp_group into its config.
    init_utils._TP_MODEL_INIT_ARGS = None
    layers.TensorParallel_Layer.tp_overlap_comm = False
    layers.TensorParallel_Layer.keep_module_on_host = False
    # A torch_autocast engine sets these and nothing unsets them (engine.destroy() included); every later
    # ZeRO optimizer in the process then picks its reduction dtype from them instead of its config
    # (ci/repro/deepspeed_torch_autocast_state_leaks.py). Cleared so one case cannot change the next.
    torch_autocast.TORCH_AUTOCAST_INITIALIZED = False
    torch_autocast.TORCH_AUTOCAST_DTYPE = None
    for n in ("_TENSOR_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP"):
        setattr(groups, n, None)
    return deepspeed_process_state()


def deepspeed_process_state() -> dict:
    """AutoTP's process-global switches as they are now (read only)."""
    from deepspeed.module_inject import layers
    from deepspeed.runtime.tensor_parallel import init_utils
    from deepspeed.runtime import torch_autocast
    from deepspeed.utils import groups

    return {
        "autotp_training_mode": layers.is_autotp_training_mode(),
        "tp_overlap_comm": layers.TensorParallel_Layer.tp_overlap_comm,
        "keep_module_on_host": layers.TensorParallel_Layer.keep_module_on_host,
        "tp_group_installed": groups._TENSOR_MODEL_PARALLEL_GROUP is not None,
        "tp_model_init_recorded": init_utils._TP_MODEL_INIT_ARGS is not None,
        "torch_autocast_initialized": torch_autocast.TORCH_AUTOCAST_INITIALIZED,
        "torch_autocast_dtype": str(torch_autocast.TORCH_AUTOCAST_DTYPE),
    }


CLEAN_STATE = {"autotp_training_mode": False, "tp_overlap_comm": False, "keep_module_on_host": False,
               "tp_group_installed": False, "tp_model_init_recorded": False, "torch_autocast_initialized": False,
               "torch_autocast_dtype": "None"}


def rank_decisions(engine, head) -> dict:
    """What DeepSpeed decided on THIS rank, read from DeepSpeed itself
    (docs/subjects.md#an-engine-heads-rank-decisions says what each key is and why)."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    tp_group, dp_group = groups.get_tensor_model_parallel_group(), groups.get_data_parallel_group()
    found = {"tp_rank": groups.get_tensor_model_parallel_rank(),
             "tp_world": groups.get_tensor_model_parallel_world_size(),
             "tp_group": sorted(dist.get_process_group_ranks(tp_group)),
             "dp_group": sorted(dist.get_process_group_ranks(dp_group)),
             "engine_dp_world": int(engine.dp_world_size),
             "optimizer": type(engine.optimizer).__name__,
             "tp_overlap_comm": getattr(type(head), "tp_overlap_comm", None),
             "keep_module_on_host": getattr(type(head), "keep_module_on_host", None),
             "head_device": head.weight.device.type if isinstance(getattr(head, "weight", None), torch.Tensor) else None,
             "immediate_grad_update": getattr(engine.optimizer, "immediate_grad_update", None),
             "grad_acc_hooks": bool(getattr(engine.optimizer, "_grad_acc_hooks", None)),
             "check_grad_overflow": getattr(engine.optimizer, "check_grad_overflow", None),
             "master_dtype": str(getattr(engine.optimizer, "master_weights_and_grads_dtype", None)),
             "torch_autocast": str(engine.torch_autocast_dtype()) if engine.torch_autocast_enabled() else None,
             "head_comm_dtype": str(getattr(getattr(head, "weight", None), "comm_dtype", None)),
             "zero_reduce_dtypes": (sorted(str(d) for d in engine.optimizer.ipg_buckets)
                                    if hasattr(engine.optimizer, "ipg_buckets") else None),
             "communication_data_type": str(engine.communication_data_type),
             "gradient_clipping": float(engine.gradient_clipping())}
    if hasattr(head, "vocab_start_index"):
        found["head_vocab_range"] = [int(head.vocab_start_index), int(head.vocab_end_index)]
    found["kv_heads"] = getattr(getattr(head, "tp_meta", None), "num_kv_heads", None)
    return found


def merged_tp_model_init(values: dict, config: dict) -> dict:
    """model_init = tp_model_init: the autotp_size DeepSpeed's merge of tp_model_init's record put in the config."""
    if values.optional("model_init", "plain") != "tp_model_init":
        return {}
    return {"merged_autotp_size": config["tensor_parallel"].get("autotp_size")}


def reports_grad_norm(values: dict) -> bool:
    """Whether the engine keeps the clipping norm: not for a plain optimizer under ZeRO 0 in fp32
    (docs/subjects.md#an-engine-heads-rank-decisions)."""
    return values.optional("clip", 0.0) > 0 and not (values["zero"] == 0 and values["dtype"] == "fp32")


def record_weights(obs: RankObservations, step: int, params: dict, zero_stage: int) -> None:
    """Each rank's own (TP-local) weights; ZeRO-3 first gathers what it partitioned across ranks."""
    import deepspeed

    with (deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None) if zero_stage == 3
          else contextlib.nullcontext()):
        for name, p in params.items():
            obs.record("weight", step, None, name, p)


def record_master_weights(obs: RankObservations, step: int, engine, params: dict, zero_stage: int) -> None:
    """The float32 master copy of each (TP-local) parameter after the update: safe_get_full_fp32_param, or
    ZeRO 0's fp16_groups/fp32_groups pairs, which that function does not reach."""
    from deepspeed.utils import safe_get_full_fp32_param

    if zero_stage == 0:
        opt = engine.optimizer
        master = {id(p): m for lows, highs in zip(opt.fp16_groups, opt.fp32_groups) for p, m in zip(lows, highs)}
        for name, p in params.items():
            if id(p) in master:
                obs.record("master_weight", step, None, name, master[id(p)])
        return
    for name, p in params.items():
        value = safe_get_full_fp32_param(p)
        if value is not None:
            obs.record("master_weight", step, None, name, value)


def saved_state_dict(engine, how: str) -> dict | None:
    """What a user who saves the trained model gets on global rank 0: key -> (float64 array, dtype name); None
    on the other ranks, which take part (docs/subjects.md#an-engine-heads-rank-decisions, save)."""
    import os
    import shutil
    import tempfile

    import torch.distributed as dist

    directory = tempfile.mkdtemp(prefix="parity_save_")  # per rank: only rank 0 writes into its own
    try:
        if how == "16bit":
            written = engine.save_16bit_model(directory, "pytorch_model.bin")
            path = os.path.join(directory, "pytorch_model.bin")
            state = torch.load(path, map_location="cpu") if written and dist.get_rank() == 0 else None
        elif how == "consolidated":
            state = engine._consolidated_16bit_state_dict()
        else:
            raise ValueError(f"save = {how!r}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if dist.get_rank() != 0 or state is None:
        return None
    return {key: (t.detach().to("cpu", torch.float64).numpy().copy(), str(t.dtype).replace("torch.", ""))
            for key, t in state.items()}


def exclude_engine_reduction(engine) -> None:
    """Keep the engine's own collectives (its ZeRO / DP gradient reduction, not the head's) out of the counts."""
    from deepspeed.utils import groups

    original = engine.allreduce_gradients

    def allreduce_gradients(*args, **kwargs):
        with collectives.paused():
            return original(*args, **kwargs)

    engine.allreduce_gradients = allreduce_gradients
    # AutoTP's one-time pre-hook that checks the batch is the same on every TP rank: the engine's, not the head's.
    handle = getattr(engine, "first_dataloader_check", None)
    hooks = engine.module._forward_pre_hooks
    if handle is not None and handle.id in hooks:
        hook = hooks[handle.id]

        def paused_hook(*args, **kwargs):
            with collectives.paused():
                return hook(*args, **kwargs)

        hooks[handle.id] = paused_hook
    collectives.ignore_group(getattr(engine, "data_parallel_group", None))
    collectives.ignore_group(groups._DATA_PARALLEL_GROUP)


def user_mpu(**answers):
    """A Megatron-style mpu as a user hands one to DeepSpeed: ``get_<key>()`` returns ``answers[key]``."""
    return types.SimpleNamespace(**{f"get_{key}": (lambda value=value: value) for key, value in answers.items()})


def engine_dtype_requirements(values: dict) -> list[str]:
    """DeepSpeed's engines (training and inference) check the accelerator's dtypes before anything
    runs; on CPU, fp16 is offered only where oneDNN has it."""
    return ["cpu_fp16"] if values["device"] == "cpu" and values["dtype"] == "fp16" else []


class _RecordingFunction:
    """Stands in for an autograd Function's ``apply`` and notes which backend ran."""

    def __init__(self, original, backend, log):
        self.original, self.backend, self.log = original, backend, log

    def apply(self, *args):
        self.log.append(self.backend)
        return self.original.apply(*args)


@contextlib.contextmanager
def record_loss_backend(log: list):
    """Observe which vocabulary-parallel CE implementation each call actually ran."""
    ce = importlib.import_module("deepspeed.sequence.cross_entropy")
    liger_fn = ce._liger_vocab_cross_entropy

    def liger_recorded(*args, **kwargs):
        log.append("liger")
        return liger_fn(*args, **kwargs)

    torch_recorded = _RecordingFunction(ce._VocabParallelCrossEntropy, "torch", log)
    with mock.patch.multiple(ce, _VocabParallelCrossEntropy=torch_recorded, _liger_vocab_cross_entropy=liger_recorded):
        yield


def backend_per_micro(log: list, backends: dict):
    """A driver micro_context: the CE backends record_loss_backend logged in each micro-batch, into
    backends[(step, micro)]."""
    @contextlib.contextmanager
    def backend_of(step, micro):
        before = len(log)
        yield
        backends[(step, micro)] = log[before:]
    return backend_of


class _TritonClaimingAccelerator:
    """The CPU accelerator, answering the Liger gate's two questions as a CUDA accelerator does."""

    def __init__(self, real):
        self._real = real

    def is_triton_supported(self):
        return True

    def on_accelerator(self, tensor):
        return True

    def __getattr__(self, name):
        return getattr(self._real, name)


@contextlib.contextmanager
def claimed_triton(active: bool):
    """A harness shortcut for CPU ranks: the CE module's view of the accelerator claims Triton, so DeepSpeed's
    Liger gate is reached (docs/subjects.md#liger-in-tritons-interpreter-on-cpu)."""
    if not active:
        yield
        return
    ce = importlib.import_module("deepspeed.sequence.cross_entropy")
    proxy = _TritonClaimingAccelerator(ce.get_accelerator())
    with mock.patch.object(ce, "get_accelerator", lambda: proxy):
        yield


def head_spec(head: str, partition_type: str, **more) -> dict:
    """A partition_config layer spec for the weight of the head at path ``head``."""
    return {"patterns": [rf"{re.escape(head)}\.weight$"], "partition_type": partition_type, **more}


def skip_proj_specs(*specs, **options) -> dict:
    """tensor_parallel's partition_config with no default specs, proj replicated and ``specs`` after it."""
    return {"partition_config": {"use_default_specs": False, **options, "layer_specs": [dict(SKIP_PROJ), *specs]}}


def use_default_specs(values: dict) -> dict:
    """partition_config's use_default_specs as the axis sets it: false, left out (DeepSpeed's default, true) or
    true; without a preset_model none may change the model, so the claims are the same for all three."""
    return {"false": {"use_default_specs": False}, "unset": {},
            "true": {"use_default_specs": True}}[values.optional("use_default_specs", "false")]


# The bf16 section's switch axes: axis -> (its value away from DeepSpeed's default, the bf16 config keys it sets,
# what DeepSpeed must then decide on every rank; docs/subjects.md#an-engine-heads-rank-decisions).
BF16_SWITCH_AXES = {
    "immediate_grad": (True, {"immediate_grad_update": True}, {"immediate_grad_update": True, "grad_acc_hooks": True}),
    "overflow_check": (False, {"check_grad_overflow": False}, {"check_grad_overflow": False}),
    "bf16_master": (True, {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
                    {"master_dtype": "torch.bfloat16"}),
}


def bf16_switches(values: dict, part: int) -> dict:
    """The switches the case's axes set away from DeepSpeed's defaults (part 1: their config keys, 2: the decisions
    they must make); nothing at the defaults, so every other bf16 case hands DeepSpeed the config it always did."""
    return {key: setting for axis, entry in BF16_SWITCH_AXES.items() if values.optional(axis, not entry[0]) == entry[0]
            for key, setting in entry[part].items()}


def clip_left_out(values: dict) -> bool:
    """clip_key "unset": the case writes no gradient_clipping, so DeepSpeed's default applies."""
    return values.optional("clip_key", "set") == "unset"


def switch_decisions(values: dict) -> dict:
    """What the overlap and bf16 switch axes must make DeepSpeed decide on every rank (a switch parsed but never
    applied would pass as parity); only where the subject has the axis."""
    found = {}
    if "overlap" in values:
        overlap = values["overlap"]
        # The class attribute the head's forward reads, and the autograd function that then ran.
        found["tp_overlap_comm"] = overlap
        found["column_function"] = "AsyncColumnParallel" if overlap else "ColumnParallel"
    found.update(bf16_switches(values, 2))
    if values.optional("keep_on_host", False):
        # The switch reached the layer class, and the engine still trains the head on the case's device.
        found["keep_module_on_host"] = True
        found["head_device"] = values["device"]
    return found


def column_function(logits) -> str | None:
    """Which of AutoTP's column autograd functions the head's forward ran, anywhere in the logits' graph."""
    # Nodes stay referenced (kept) while the walk runs, so no dropped node's id() is reused and looks visited
    # (docs/subjects.md#which-column-function-ran).
    seen, frontier, visited, kept = set(), [logits.grad_fn], set(), []
    while frontier:
        node = frontier.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        kept.append(node)
        seen.add(type(node).__name__)
        frontier += [nxt for nxt, _ in node.next_functions]
    for name in ("AsyncColumnParallelBackward", "ColumnParallelBackward"):
        if name in seen:
            return name[:-len("Backward")]
    return None


class DeepSpeedSubject(Subject):
    """A subject whose ranks run DeepSpeed: its comm layer joined, AutoTP's process-global state reset before a case."""
    framework = "deepspeed"
    clean_state = CLEAN_STATE

    def reset_process_state(self, ctx: RankContext) -> dict:
        setup_deepspeed(ctx)
        return reset_deepspeed_state()


class EngineHead(DeepSpeedSubject):
    """deepspeed.initialize on the user's model, trained by the driver through the engine (EngineUpdate);
    subclasses say how the head is selected and what it must become."""
    axes = COMMON_AXES

    def tensor_parallel_config(self, values: dict) -> dict:
        raise NotImplementedError

    def ds_config(self, values: dict, train) -> dict:
        cfg = {
            "train_micro_batch_size_per_gpu": train.batch,
            "gradient_accumulation_steps": train.micro_batches,
            # Explicit: DeepSpeed's default of 1.0 would silently clip cases that ask for none (clip_key "unset"
            # takes the user's path that leaves the key out).
            **({} if clip_left_out(values) else {"gradient_clipping": train.clip}),
            # ZeRO's default buckets hold 5e8 elements: allocating and zeroing them costs seconds
            # per case on CPU for a model of a few thousand parameters.
            "zero_optimization": {"stage": values["zero"], "reduce_bucket_size": 1_000_000,
                                  "allgather_bucket_size": 1_000_000},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
            "tensor_parallel": {"autotp_size": values["tp"], "tp": {"tp_grain_size": values.optional("grain", 1)},
                                **({"tp_overlap_comm": True} if values.optional("overlap", False) else {}),
                                **({"keep_module_on_host": True} if values.optional("keep_on_host", False) else {}),
                                **self.tensor_parallel_config(values)},
        }
        cfg.update(DP_REDUCE_CONFIG[values.optional("dp_reduce", "average")])
        if values.optional("grad_accum", "model") == "fp32":
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
        if values.optional("autocast", "off") != "off":
            cfg["torch_autocast"] = {"enabled": True, "dtype": AUTOCAST_CONFIG[values["autocast"]],
                                     **self.lower_precision_safe_modules(values)}
        if values["zero"] == 3:
            # Partition every parameter, however small (the default keeps those under 1e5 whole).
            cfg["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_prefetch_bucket_size=0)
            if values.optional("save", "none") == "16bit":
                # Without it save_16bit_model writes nothing under ZeRO 3 (it says so in the log and returns False).
                cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        if values["dtype"] == "bf16":
            cfg["bf16"] = {"enabled": True, **bf16_switches(values, 1)}
        elif values["dtype"] == "fp16":
            cfg["fp16"] = loss_scaling.fp16_section(values)
        return cfg

    def lower_precision_safe_modules(self, values: dict) -> dict:
        """autocast_modules head / base: nn.Linear and the head's AutoTP class (or its base class), as a user lists
        them to reduce the head's gradient in the autocast dtype (docs/subjects.md#torch_autocasts-comm_dtype-marks)."""
        choice = values.optional("autocast_modules", "default")
        if choice == "default":
            return {}
        head_class = self.claims(values).module_types[values.optional("head", "lm_head")]
        named = AUTOTP_BASE_CLASS[head_class] if choice == "base" else head_class
        return {"lower_precision_safe_modules": ["torch.nn.modules.linear.Linear",
                                                 f"deepspeed.module_inject.layers.{named}"]}

    records_rank_decisions = True  # rank_decisions(): groups, DP size, head range, from DeepSpeed

    def decided(self, values):
        autocast = values.optional("autocast", "off")
        found = {"torch_autocast": None if autocast == "off" else str(DTYPES[autocast]), **switch_decisions(values)}
        # The dtype communication_data_type names, as torch spells it (None: the dp_reduce value sets none).
        comm_key = DP_REDUCE_CONFIG[values.optional("dp_reduce", "average")].get("communication_data_type")
        communication = None if comm_key is None else str(DTYPES[comm_key])
        if autocast != "off":
            # The head is marked only where the case names its AutoTP class (or its base class): docs/subjects.md#torch_autocasts-comm_dtype-marks
            named = values.optional("autocast_modules", "default") in ("head", "base")
            found["head_comm_dtype"] = str(DTYPES[autocast]) if named else "None"
        if values.optional("model_init", "plain") == "tp_model_init":
            found["merged_autotp_size"] = values["tp"]
        if clip_left_out(values):
            found["gradient_clipping"] = 1.0  # DeepSpeed 0.19.8's GRADIENT_CLIPPING_DEFAULT, proven applied
        elif "clip" in values:
            found["gradient_clipping"] = float(values["clip"])
        if values.optional("grad_accum", None) == "fp32" and values["zero"] == 1 and values["dtype"] == "bf16":
            # The path these cases are for: DeepSpeed's documented choice for bf16 weights with float32
            # accumulation under ZeRO 1 (engine._do_optimizer_sanity_check), proven taken.
            found["optimizer"] = "BF16_Optimizer"
        elif values["zero"] in (1, 2, 3) and autocast != "off":
            # torch_autocast's comm_dtype marks: proj in the autocast dtype, everything else in fp32
            # (docs/subjects.md#torch_autocasts-comm_dtype-marks).
            found["zero_reduce_dtypes"] = sorted({str(DTYPES[autocast]), "torch.float32"})
        elif values["zero"] in (1, 2) and communication is not None:
            found["zero_reduce_dtypes"] = [communication]  # what communication_data_type asks for
        if communication is not None:
            found["communication_data_type"] = communication
        if values.optional("model_config", "none") != "none":
            found["kv_heads"] = text_kv_heads(values["model_config"])
        if loss_scaling.setting(values) is not None:
            found.update(loss_scaling.documented(loss_scaling.setting(values), self.training_spec(values).steps))
        return found

    # Decisions every rank must share (compare.check_rank_decisions): a step one rank skips and another applies
    # leaves the shards of one model at different steps.
    agreed_decisions = ("loss_scales", "skipped", "skipped_steps")

    def requires(self, values):
        # A CPU case that claims Triton for the Liger backend runs Liger's kernels in Triton's interpreter
        # (docs/subjects.md#liger-in-tritons-interpreter-on-cpu).
        interpreted = (values["device"] == "cpu" and values.optional("triton", None) == "claimed"
                       and values["backend"] == "liger")
        return (super().requires(values) + engine_dtype_requirements(values)
                + (["triton_interpreter"] if interpreted else []))

    def records_master_weights(self, values: dict) -> bool:
        # bf16/fp16: DeepSpeed's optimizer keeps a float32 master; with bf16 masters asked for, neither it nor the
        # reference (SGD on the bf16 parameters) keeps one, and the weights are what the update produced.
        return values["dtype"] != "fp32" and not values.optional("bf16_master", False)

    def training_spec(self, values: dict):
        spec = super().training_spec(values)
        if (scaler := loss_scaling.grad_scaler(values)) is not None:
            spec = dataclasses.replace(spec, loss_scale=scaler)
        if values.optional("dp_reduce", None) == "comm_bf16":
            # A user who asks for bf16 gradient communication in plain PyTorch: DDP with bf16_compress_hook.
            spec = dataclasses.replace(spec, comm_dtype=torch.bfloat16)
        if (scaler := loss_scaling.autocast_grad_scaler(values)) is not None:
            spec = dataclasses.replace(spec, loss_scale=scaler)
        return dataclasses.replace(spec, master=False) if values.optional("bf16_master", False) else spec

    def invalid(self, values: dict) -> str | None:
        if values.optional("dp_reduce", None) == "comm_bf16" and (values["dtype"] != "fp32"
                                                        or values.optional("autocast", "off") != "off"):
            # A bf16/fp16 model communicates in its own dtype by default; autocast sets ZeRO's reduction dtype itself.
            return "dp_reduce comm_bf16 is held on fp32 models without autocast (DDP's bf16_compress_hook reference)"
        if values.optional("labels", "labels") == "shift_labels" and values["reduction"] != "mean":
            # num_items would need the trainer's count over shift_labels (references/data.py counts labels[..., 1:]).
            return "labels shift_labels is held to HF's mean only"
        if values.optional("autocast_modules", "default") != "default" and values.optional("autocast", "off") == "off":
            return "autocast_modules sets torch_autocast.lower_precision_safe_modules, which needs autocast on"
        if clip_left_out(values) and values.optional("clip", 0.0) != 0.0:
            return "clip_key unset leaves gradient_clipping out of the config: the reference is unclipped (clip 0)"
        return loss_scaling.invalid_reason(values)

    # -- what a model family changes in the engine loop (the HF tp_plan subjects override these) --
    def build(self, values: dict, dtype: torch.dtype) -> torch.nn.Module:
        """The user's model, before DeepSpeed sees it: the same weights the reference starts from, and the
        HF-style config the case's model_config axis names (DeepSpeed reads it; the numbers do not)."""
        spec = self.model_spec(values)
        model = build_model(spec, self.training_spec(values).seed, dtype)
        config = hf_like_config(values.optional("model_config", "none"), spec.vocab, spec.hidden, spec.tied)
        if config is not None:
            model.config = config
        return model

    def user_model(self, values: dict, ctx: RankContext, config: dict) -> torch.nn.Module:
        """The model as the user hands it to deepspeed.initialize (model_init); tp_model_init takes autotp_size
        (and a section left at DeepSpeed's defaults) out of ``config`` in place, as a user who states it once."""
        import deepspeed

        how, dtype = values.optional("model_init", "plain"), DTYPES[values["dtype"]]
        if how in ("zero_init", "zero_init_dtype"):
            return self.zero_init_model(values, config, dtype, explicit_dtype=how == "zero_init_dtype")
        model = self.build(values, dtype).to(ctx.device)
        if how == "tp_model_init":
            section = config["tensor_parallel"]
            del section["autotp_size"]
            if section == {"tp": {"tp_grain_size": 1}}:  # DeepSpeed's defaults: such a user writes no section at all
                del config["tensor_parallel"]
            deepspeed.tp_model_init(model, tp_size=values["tp"], dtype=dtype)
        return model

    def zero_init_model(self, values: dict, config: dict, dtype: torch.dtype, explicit_dtype: bool):
        """A big model's path under ZeRO 3, as transformers' from_pretrained takes it: built under zero.Init, the
        reference's weights loaded on rank 0 and broadcast (docs/subjects.md#an-engine-heads-rank-decisions)."""
        import deepspeed
        import torch.distributed as dist

        from references.tiny_lm import TinyCausalLM

        if values["zero"] != 3:
            raise ValueError(f"model_init = {values['model_init']!r} needs zero = 3, not {values['zero']}")
        pretrained = self.build(values, dtype).state_dict()
        # zero_init: no dtype argument, zero.Init takes the config's, as transformers calls it. zero_init_dtype: the
        # case's dtype named as well, which zero.Init's docstring offers.
        with deepspeed.zero.Init(config_dict_or_path=config, **({"dtype": dtype} if explicit_dtype else {})):
            model = TinyCausalLM(self.model_spec(values))
        partitioned = all(hasattr(p, "ds_id") and p.numel() == 0 for p in model.parameters())
        if not partitioned:  # the case would prove nothing about the zero.Init path
            raise RuntimeError("deepspeed.zero.Init left a parameter whole: the model is not ZeRO-3 partitioned")
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            if dist.get_rank() == 0:
                model.load_state_dict(pretrained)
        return model

    def forward(self, engine, batch: dict, num_items: int, spec):
        """One micro-batch through the engine -> (loss, logits). The reference model applies its
        own reduction, so it takes num_items_in_batch always."""
        return engine(**batch, num_items_in_batch=num_items)

    def capture_head_input(self, model, sink: dict) -> None:
        capture_head_input_and_grad(model, sink)

    def model_facts(self, model) -> dict:
        """Facts about the model worth recording before DeepSpeed rewrites it."""
        return {}

    # process = after_*: an engine a user ran earlier in the same process, built and destroyed before the case's
    # own model; what it leaves stays (docs/subjects.md#an-engine-heads-rank-decisions).
    EARLIER_ENGINE = {"after_zero3": {"zero": 3},
                      "after_autocast": {"dtype": "fp32", "autocast": "bf16", "dp_reduce": "average"}}

    def run_earlier_engine(self, values: dict, ctx: RankContext) -> None:
        import deepspeed

        first = values.replace(**self.EARLIER_ENGINE[values["process"]])
        train = self.training_spec(first)
        model = self.build(first, DTYPES[first["dtype"]]).to(ctx.device)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          optimizer=lambda p: torch.optim.SGD(p, lr=train.lr),
                                          config=self.ds_config(first, train))
        engine.destroy()

    def run_rank(self, values: dict, ctx: RankContext) -> RankObservations:
        import deepspeed

        setup_deepspeed(ctx)
        tp = values["tp"]
        install_tp_groups(ctx, tp, values.optional("dist_debug", "off"))
        tp_rank, dp_rank = ctx.tp_dp(tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        if values.optional("process", "fresh") != "fresh":
            self.run_earlier_engine(values, ctx)
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        # Read before the user's model exists: zero.Init (model_init = zero_init) swaps F.linear for that model, by design.
        obs.facts["functional_linear"] = functional_linear()
        config = self.ds_config(values, train)
        model = self.user_model(values, ctx, config)
        obs.facts.update(self.model_facts(model))
        backend_log: list = []
        with record_loss_backend(backend_log):
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              optimizer=lambda p: torch.optim.SGD(p, lr=train.lr),
                                              config=config)
            try:
                record_structure(obs, model, self.claims(values))
                head = attribute(model, values.optional("head", "lm_head"))
                obs.facts["rank_decisions"] = {**rank_decisions(engine, head), **merged_tp_model_init(values, config)}
                captured = {}
                self.capture_head_input(model, captured)
                exclude_engine_reduction(engine)
                obs.facts["loss_backend"] = {}

                def first_column_function(step, micro, loss, logits):
                    if step == 0 and micro == 0:
                        obs.facts["rank_decisions"]["column_function"] = column_function(logits)

                driver.train(driver.Run(obs, train, lambda batch, n: self.forward(engine, batch, n, spec),
                                        EngineUpdate(engine, dict(model.named_parameters()), values,
                                                     self.records_master_weights(values)),
                                        driver.lm_batches(train, spec, dp_rank, ctx.device), spec.reduction,
                                        captured=captured, record_collectives=True,
                                        micro_context=backend_per_micro(backend_log, obs.facts["loss_backend"]),
                                        after_forward=first_column_function, outputs_after_backward=False))
                obs.facts.setdefault("collectives", {})
                if values.optional("save", "none") != "none":
                    obs.facts["saved"] = saved_state_dict(engine, values["save"])
            finally:
                engine.destroy()
        return obs


class EngineUpdate:
    """The driver's update through a DeepSpeed engine, as the HF Trainer drives it; fp16 gradients are recorded
    with the loss scale divided out; records False: weights only (docs/subjects.md#an-engine-heads-rank-decisions)."""

    def __init__(self, engine, params: dict, values: dict, masters: bool, records: bool = True):
        self.engine, self.weights, self.masters, self.records = engine, params, masters, records
        self.params = params if records else None  # what driver.record_params records the structure of
        self.zero, self.reports_norm = values["zero"], records and reports_grad_norm(values)
        self.scaled = records and loss_scaling.setting(values) is not None
        # torch_autocast float16: torch's GradScaler, the engine's or its ZeRO optimizer's, one per rank.
        fp16_autocast = records and values.optional("autocast", None) == "fp16"
        self.amp_scaler = loss_scaling.autocast_scaler(engine) if fp16_autocast else None
        self.scale, self.scales, self.skipped = 1.0, [], []

    def start(self, run) -> None:
        self.obs, self.clip = run.obs, run.train.clip > 0 and self.reports_norm
        if self.records:
            record_weights(self.obs, -1, self.weights, self.zero)

    def begin_step(self, step: int) -> None:
        self.scale = (loss_scaling.current_scale(self.engine) if self.scaled else
                      float(self.amp_scaler.get_scale()) if self.amp_scaler is not None else 1.0)

    def backward(self, objective) -> None:
        self.engine.backward(objective, scale_wrt_gas=False)

    def after_micro(self, step: int, micro: int) -> None:
        from deepspeed.utils import safe_get_full_grad

        if self.records and self.engine.is_gradient_accumulation_boundary():
            for name, p in self.weights.items():
                grad = safe_get_full_grad(p)
                if grad is not None:
                    self.obs.record("grad", step, None, name, grad, unscale=self.scale)
        self.engine.step()

    def end_step(self, step: int) -> None:
        engine = self.engine
        if self.records:
            self.obs.facts.setdefault("global_steps", []).append(engine.global_steps)
        if self.scaled:
            self.scales.append(self.scale)
            if loss_scaling.step_overflowed(engine):
                self.skipped.append(step)
        elif self.amp_scaler is not None:
            # GradScaler keeps no skip flag: it halves on exactly the skipped steps; ZeRO may skip before it sees one
            # (docs/subjects.md#fp16-dynamic-loss-scaling).
            self.scales.append(self.scale)
            if float(self.amp_scaler.get_scale()) < self.scale or loss_scaling.step_overflowed(engine):
                self.skipped.append(step)
        if self.clip:
            norm = engine.get_global_grad_norm()
            self.obs.record("grad_norm", step, None, None, torch.as_tensor(float(norm), dtype=torch.float64))
        record_weights(self.obs, step, self.weights, self.zero)
        if self.masters:
            record_master_weights(self.obs, step, engine, self.weights, self.zero)

    def finish(self) -> None:
        if self.scaled:
            self.obs.facts["rank_decisions"].update(loss_scales=self.scales, skipped=self.skipped,
                                                    skipped_steps=int(self.engine.skipped_steps))
        elif self.amp_scaler is not None:
            self.obs.facts["rank_decisions"].update(loss_scales=self.scales, skipped=self.skipped)


# The pad id the engine subjects' model may pass: 0 is the one case of the installed loss dropping it; 3 (the loss-only
# CEs' other id) would meet the same documented divergence at every vocab_parallel point.
ENGINE_IGNORE_INDEX = (-100, 0)


class ColumnGatheredHead(EngineHead):
    name = "column_gathered"
    feature = "column head (gathered logits)"
    description = ("PR-A: lm_head as column-parallel LinearLayer with gather_output=True, selected by a "
                   "partition_config spec; full-vocabulary logits on every rank, the suite's CE on top.")
    axes = {**COMMON_AXES, "ignore_index": ENGINE_IGNORE_INDEX, "process": None, "use_default_specs": None,
            "grad_allreduce": None, "dist_debug": None, "save": None, **SWITCH_AXES, "model_init": None, "labels": None,
            **AUTOCAST_MODULES_AXES,
            # The config default is the engine's, not the head's: one subject takes it (its mark binds clip_key alone).
            "clip_key": None}

    def tensor_parallel_config(self, values):
        # grad_allreduce on proj's skip spec: proj is replicated and reads the whole (replicated) hidden state, so
        # its gradient is already the full one on every rank; the claims and the reference stay plain torch's.
        proj = {**SKIP_PROJ, **({"grad_allreduce": True} if values.optional("grad_allreduce", False) else {})}
        return {"partition_config": {**use_default_specs(values), "layer_specs": [
            proj, head_spec(values["head"], "column", gather_output=True)]}}

    def claims(self, values):
        return head_claims(values["head"], "LinearLayer", 0, reports_grad_norm=reports_grad_norm(values))


class VocabParallelHead(EngineHead):
    name = "vocab_parallel"
    feature = "vocab-parallel head + CE"
    description = ("PR-B: vocab_parallel_lm_head=true; VocabParallelLinear keeps rank-local logits and the "
                   "engine installs DeepSpeed's VocabParallelCausalLMLoss as model.loss_function.")
    # reduction: what VocabParallelCausalLMLoss reaches; head: the named ones and "output" (lm_head_patterns);
    # model_config: the head counts AutoTP reads (docs/subjects.md#an-engine-heads-rank-decisions).
    axes = {"backend": None, **COMMON_AXES, "reduction": ("mean", "num_items"), "head": (*NAMED_HEADS, "output"),
            "ignore_index": ENGINE_IGNORE_INDEX, "triton": None, "dist_debug": None, "save": None, **SWITCH_AXES,
            "model_config": None, "model_init": None, "labels": None, **AUTOCAST_MODULES_AXES}

    def run_rank(self, values, ctx):
        with claimed_triton(values["triton"] == "claimed"):
            return super().run_rank(values, ctx)

    def tensor_parallel_config(self, values):
        leaf = values["head"].split(".")[-1]
        # A head with another name is a head only if the user says so (auto_tp._is_lm_head_name).
        patterns = {} if leaf in ("lm_head", "embed_out") else {"lm_head_patterns": [leaf]}
        return {"vocab_parallel_lm_head": True, "vocab_parallel_ce_backend": values["backend"],
                **skip_proj_specs(**patterns)}

    def claims(self, values):
        return head_claims(values["head"], "VocabParallelLinear", 0, vocab_loss=True,
                           loss_backend=expected_ce_backend(values), reports_grad_norm=reports_grad_norm(values))

    def unavailable_reason(self, values):
        reason = super().unavailable_reason(values)
        if reason is None and expected_ce_backend(values) == "liger" and find_spec("liger_kernel") is None:
            reason = "liger-kernel is not installed (pip install -e '.[liger]')"
        return reason


def expected_ce_backend(values: dict) -> str:
    """Which CE must run by DeepSpeed's documented gate (_liger_can_run), from the suite's own partition: Liger
    only on a Triton-capable accelerator with equal shards (docs/subjects.md#deepspeeds-liger-backend)."""
    triton = values["device"] == "cuda" or values.optional("triton", None) == "claimed"
    if values["backend"] != "liger" or not triton:
        return "torch"
    sizes = shard_sizes(values["vocab"], values["tp"], values.optional("grain", 1))
    return "liger" if len(set(sizes)) == 1 else "torch"
