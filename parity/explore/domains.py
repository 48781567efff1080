"""What the search may draw: each explorable subject's axes over their whole domains.

A drawn point becomes a Case exactly as a one-entry case file would make it (``cases.expand_matrix``),
so an explored case has the id, markers and expectation its case-file twin would have, and the
entry that reproduces it is printable as TOML (``entry_toml``).

Draw order is chosen for shrinking: hypothesis shrinks an integer towards the low end of its range
and a choice towards its first value, so the ranges start at their smallest meaningful value and
each axis's default comes first. A shrunk failure then differs from the defaults only where it must.
"""
from __future__ import annotations

from hypothesis import strategies as st

from parity.axes import AXES
from parity.matrix.cases import Case, expand_matrix
from parity.observe.partition import shard_sizes
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve

# Integer axes accept any integer >= their minimum; the search draws from these ranges.
#  vocab 2..300, tp 2..8: the domains (tp is further capped by --max-world, the CPU ranks
#    this machine can host); 300 is past the largest vocabulary of the matrix (269) and odd/prime
#    sizes are dense in it.
#  hidden 2..64: the tiny LM's hidden size; past 64 nothing new is sharded, only more arithmetic.
#  dp 1..4 (world = tp * dp, capped by --max-world), gas 1..4 (the accumulation loop is the same
#    code for every count above 2), grain 1..64 (64: init_inference's default), chunk 0..16 (a
#    micro-batch has 12 tokens: 13..16 is "one chunk bigger than the input").
#  sp 1..3 (world = tp * sp, capped by --max-world, drawn after tp as dp is).
#  save_tp 2..8 (the uc_* subjects' saving TP, capped by --max-world; a world it does not divide is no case): a
#    checkpoint saved at tp 1 has no AutoTP metadata and needs ds_to_universal --inject_missing_state.
RANGES = {"vocab": (2, 300), "tp": (2, 8), "hidden": (2, 64), "dp": (1, 4), "gas": (1, 4), "grain": (1, 64),
          "chunk": (0, 16), "sp": (1, 3), "save_tp": (2, 8)}
# Values the search does not draw, with why: they are documented refusals (expect.error entries
# of the case files), not parity cases, so drawing them would only rediscover the refusal.
HELD_AXES = {
    "backward": ("once", "retained-graph and create_graph backwards are refusals for most loss subjects "
                         "(cases/loss_backward.toml)"),
    "targets": ("valid", "an out-of-range target is a refusal by contract (cases/liger_ce.toml)"),
    "kl_shards": ("same", "a teacher sharded unlike the student is a refusal by contract (vocab_parallel_kl_div's "
                          "docstring; cases/deepspeed_ce.toml, where the same-width layouts it accepts are marked)"),
    "device": ("cpu", "cuda cases run on GPU machines (parity run --device cuda)"),
    "ls_formula": ("pytorch", "Liger's megatron formula differs from torch's label smoothing by design, a documented "
                              "divergence at every point (cases/liger_ce.toml)"),
    "ls_mode": ("global", "Liger's partition mode smooths over the local shard, a documented divergence at every "
                          "point (cases/liger_ce.toml)"),
    "global_vocab": ("unset", "a wrong global_vocab_size is a user error DeepSpeed trusts: its refusal and its "
                              "divergences are fixed scenarios (cases/deepspeed_ce.toml)"),
    "process": ("fresh", "after_zero3 is a documented divergence at every point (DeepSpeed leaves its ZeRO 3 linear "
                         "installed: cases/deepspeed_heads.toml), so drawing it would only rediscover it; "
                         "after_autocast likewise wherever ZeRO 1/2 reduce (cases/deepspeed_autocast.toml)"),
    "grad_allreduce": (False, "grad_allreduce on the replicated proj is a documented divergence at every point (tp x "
                              "its gradient: cases/deepspeed_heads.toml), so drawing it would only rediscover it"),
    "save": ("none", "save_16bit_model at ZeRO 0-2 is a documented divergence at every point (rank 0's TP shards: "
                     "cases/deepspeed_heads.toml); the TP-aware gather is pinned across head kinds, tp 2-4, grains "
                     "and an empty shard by the case files"),
    "autocast": ("off", "torch_autocast is a fixed scenario on fp32 models (cases/deepspeed_heads.toml): with a bias "
                        "its TP heads return fp32 logits at every point, a documented divergence"),
    "autocast_modules": ("default", "lower_precision_safe_modules acts only with autocast on, which the search holds "
                                    "off (above); naming the head's class is a fixed scenario (cases/deepspeed_autocast.toml)"),
    "allreduce": ("torch", "the shm all-reduce is a fixed scenario (cases/deepspeed_inference.toml): its op is JIT-built "
                           "once per machine and set up once per rank process, which a search over sizes would not vary"),
    "reach": ("model_types_config", "a head spec that matches nothing (anchored, or model_types on a model without "
                                    "config) is a documented divergence at every point (cases/deepspeed_heads.toml)"),
    "model_config": ("none", "a config naming head counts is a fixed scenario (cases/deepspeed_heads.toml, "
                             "deepspeed_tied_heads.toml): on a nested or lm_head_patterns head, AutoTP's kv-head "
                             "split is a documented divergence wherever the count divides the vocabulary, not tp"),
    "seq_gather": (False, "gather_sequence_loss through vocab_parallel_cross_entropy is a documented divergence at every "
                          "sp > 1 (SP x the logits gradient: cases/deepspeed_ce.toml)"),
    "model_init": ("plain", "the user's entry points are fixed scenarios (cases/deepspeed_heads.toml): zero_init needs "
                            "ZeRO 3, and zero_init_dtype is a documented divergence on a CPU without fp16"),
    "tp_source": ("tp_size", "an mpu handed to init_inference is a documented divergence at every point (its group "
                             "never reaches the head: cases/deepspeed_inference.toml)"),
    "optimizer": ("adamw", "ds_to_universal stops at every point of an SGD checkpoint (KeyError 'exp_avg', a documented "
                           "divergence: cases/deepspeed_universal.toml)"),
    "loss_scale": ("static", "fp16 dynamic loss scaling is a fixed scenario (cases/deepspeed_loss_scale.toml), designed at "
                             "one model size where step 0 must overflow (the subject refuses it elsewhere), and a "
                             "documented divergence at ZeRO 0 at every point"),
    "embedding_dim": ("unset", "embedding_partition_dim 0 is a documented crash at every point (the option is ignored: "
                               "cases/deepspeed_heads.toml), and 1 is the default spelled out"),
}
# Subjects not searched: ds_reject's variants are fixed refusal scenarios, one case each.
NOT_EXPLORED = {"ds_reject": "its cases are documented refusals, one per variant, not a parity domain"}
EXPLORE_SOURCE = "<explore>"


def explorable_subjects() -> list[str]:
    return [n for n in SUBJECTS if n not in NOT_EXPLORED and not n.startswith("_")]


def default_of(subject_name: str, axis: str):
    return SUBJECTS[subject_name].defaults.get(axis, AXES[axis].default)


def _choices(subject_name: str, axis: str) -> list:
    allowed = SUBJECTS[subject_name].axes[axis]
    values = list(allowed if allowed is not None else AXES[axis].values)
    default = default_of(subject_name, axis)
    return sorted(values, key=lambda v: not (type(v) is type(default) and v == default))  # stable: default first


@st.composite
def points(draw, subjects: list[str], max_world: int):
    """(subject name, axis values) over the subjects' whole domains, world <= max_world."""
    name = draw(st.sampled_from(subjects))
    values = {}
    for axis, allowed in SUBJECTS[name].axes.items():
        if axis in HELD_AXES:
            values[axis] = HELD_AXES[axis][0]
        elif axis in RANGES:
            lo, hi = RANGES[axis]
            if axis in ("tp", "save_tp"):
                hi = min(hi, max_world)
            elif axis in ("dp", "sp"):  # drawn after tp (every subject lists tp first): the world must fit
                lo, hi = 1, max(1, min(hi, max_world // values["tp"]))
            if allowed is None:
                values[axis] = draw(st.integers(lo, hi))
            else:  # a subject that supports a few sizes only (the hf_plan subjects: tp 2)
                values[axis] = draw(st.sampled_from(sorted(v for v in allowed if lo <= v <= hi) or [min(allowed)]))
        else:
            values[axis] = draw(st.sampled_from(_choices(name, axis)))
    return name, values


def not_a_case(name: str, values: dict, max_world: int) -> str | None:
    """Why a drawn point is not a case this machine should run (None: it is). Counted, never run."""
    subject = SUBJECTS[name]
    values = resolve(subject, values)  # the drawn axes, the rest at their defaults, as the case will have them
    if subject.world_size(values) > max_world:
        return f"world {subject.world_size(values)} > --max-world {max_world}"
    if subject.invalid(values):
        return subject.invalid(values)
    claims = subject.claims(values)
    vocab_sharded = not claims.param_shards or 0 in claims.param_shards.values()
    # The gathered column head (LinearLayer) takes a (0, hidden) shard and trains (cases/deepspeed_heads.toml, vocab 3
    # over tp 4): only the vocabulary-parallel head and CE refuse one, so its empty splits are cases to draw.
    gathered_head = claims.module_types.get(values.optional("head", "lm_head")) == "LinearLayer"
    if (claims.split == "near_even" and vocab_sharded and not gathered_head
            and min(shard_sizes(values["vocab"], values["tp"], values.optional("grain", 1))) == 0):
        # DeepSpeed refuses an empty vocabulary shard by design (ds_reject vocab_empty_shard / ce_empty_shard).
        return "an empty vocabulary shard (DeepSpeed refuses it: ds_reject vocab_empty_shard, ce_empty_shard)"
    why = empty_shard_at_save(subject, values)
    if why:
        return why
    if values.optional("zero", 0) >= 2 and values.optional("dp_reduce", "average") in ("prescale", "predivide2"):
        # ZeRO 2 and 3's reduce-scatter refuses DP pre-scaling (an assert at optimizer construction).
        return ("DP gradient pre-scaling under ZeRO 2/3 (DeepSpeed refuses it: ds_reject zero2_prescale, "
                "zero2_predivide)")
    if (values.optional("zero", 0) == 0 and values.optional("grad_accum", "model") == "fp32"
            and values.optional("dtype", None) != "fp32"):
        # Without ZeRO, DeepSpeed refuses low-precision weights with float32 gradient accumulation.
        return ("bf16/fp16 weights with float32 gradient accumulation without ZeRO (DeepSpeed refuses the mix: "
                "ds_reject zero0_bf16_fp32_accum)")
    why = bf16_switch_off_its_reader(values)
    if why:
        return why
    if subject.refuses_uneven_vocab and values["vocab"] % values["tp"]:
        return f"an uneven vocabulary: {subject.refuses_uneven_vocab}"
    return subject.unavailable_reason(values)


def empty_shard_at_save(subject, values: dict) -> str | None:
    """The uc_* subjects train first at save_tp: a vocabulary-parallel head (VocabParallelLinear) that save_tp leaves an
    empty shard is refused by the saving engine's initialize, the same refusal as at tp (ds_reject vocab_empty_shard).
    The other heads accept it and are cases (cases/deepspeed_universal.toml: ds_to_universal's crash)."""
    save_tp = values.optional("save_tp", None)
    if save_tp is None:
        return None
    claims = subject.claims(values.replace(tp=save_tp))
    head = values.optional("head", "lm_head")
    if claims.module_types.get(head) == "VocabParallelLinear" and min(shard_sizes(values["vocab"], save_tp, 1)) == 0:
        return (f"an empty vocabulary shard at save_tp {save_tp} (the saving engine's initialize refuses it: ds_reject "
                "vocab_empty_shard)")
    return None


def bf16_switch_off_its_reader(values: dict) -> str | None:
    """A bf16 switch drawn where no DeepSpeed optimizer reads it (its case would assert a decision nothing makes), or
    where it is a documented refusal or divergence (cases/deepspeed_heads.toml)."""
    bf16, zero = values.optional("dtype", None) == "bf16", values.optional("zero", 0)
    bf16_optimizer = bf16 and zero == 1 and values.optional("grad_accum", "model") == "fp32"
    if values.optional("immediate_grad", False) and not bf16_optimizer:
        return "bf16.immediate_grad_update off BF16_Optimizer (bf16, ZeRO 1, grad_accum fp32), its only reader"
    if values.optional("overflow_check", True) is False and not (bf16 and zero in (1, 2) and not bf16_optimizer):
        return "bf16.check_grad_overflow off the bf16 ZeRO 1/2 optimizer, its only reader"
    if values.optional("bf16_master", False) and not (bf16 and zero in (1, 2, 3)):
        return "bf16_master_weights_and_grads without bf16 or without ZeRO (config.py refuses ZeRO 0)"
    if values.optional("bf16_master", False) and bf16_optimizer:
        return "bf16_master_weights_and_grads under BF16_Optimizer: a documented divergence (the switch is dropped)"
    return None


def explored_case(name: str, values: dict, source: str = EXPLORE_SOURCE) -> Case:
    """The case a one-entry case file with these axes makes (same id, markers, validation)."""
    (case,) = expand_matrix(source, 0, entry_table(name, values))
    return case


def entry_table(name: str, values: dict) -> dict:
    # Only the axes off their defaults: the rest are filled in by the case file's own defaults.
    shown = {a: [v] for a, v in values.items() if not (type(v) is type(default_of(name, a))
                                                         and v == default_of(name, a))}
    return {"subject": name, "axes": shown}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def entry_toml(name: str, values: dict, description: str) -> str:
    """A ready [[matrix]] entry for cases/*.toml that makes exactly this case."""
    table = entry_table(name, values)
    lines = ["[[matrix]]", f"subject = {_toml_value(name)}", f"description = {_toml_value(description)}",
             "[matrix.axes]"]
    lines += [f"{a} = [{_toml_value(v[0])}]" for a, v in table["axes"].items()]
    return "\n".join(lines) + "\n"
