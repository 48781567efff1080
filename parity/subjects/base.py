"""The one interface every subject implements: ``run_rank`` turns a case into observations on each rank,
``claims`` says what the subject installs, shards and runs; both are checked, so a subject that silently
did nothing, or something else, fails (docs/subjects.md#the-subject-interface)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from references.tiny_lm import ModelSpec
from references.trajectory import TrainingSpec


# Seed N of the seed axis moves a subject's base seed by N * SEED_STRIDE (docs/checks.md#seeds).
SEED_STRIDE = 1000

# The head axis's values every subject with a head takes ("output" only where lm_head_patterns names it).
NAMED_HEADS = ("lm_head", "embed_out", "model.lm_head")


def case_seed(base: int, values: dict) -> int:
    """The seed a case's model and data are drawn from: ``base`` moved by its seed axis."""
    return base + SEED_STRIDE * values["seed"]


def padding_index(values: dict) -> int | None:
    """The embedding's padding_idx a case's ``padding`` axis names (none, token 0, token vocab-1)."""
    return {"none": None, "first": 0, "last": values["vocab"] - 1}[values.optional("padding", "none")]


@dataclass(frozen=True)
class Claims:
    module_types: dict  # module path in the model -> class name that must be there after setup
    param_shards: dict  # parameter name -> dim it is sharded along, None when replicated
    # parameter name -> per TP rank, the (start, stop) ranges it holds: a documented layout other than the formula.
    param_layout: dict = field(default_factory=dict)
    # per-micro-batch records -> the dim a rank holds a shard of (None: all of it); shards are also checked whole.
    micro_records: dict = field(default_factory=lambda: {"logits": None, "loss": None, "head_input_grad": None})
    exact_records: tuple = ()  # records that involve no arithmetic: compared bitwise with the reference
    loss_backend: str | None = None  # backend that must run on every rank for every micro-batch
    # The implementation that must carry the head's one collective per forward (facts["collective_path"]).
    collective_path: str | None = None
    # The precision every matrix product must take its operands in (facts["gemm_dtypes"]); None: not claimed.
    gemm_dtype: str | None = None
    reports_grad_norm: bool = False  # the subject exposes the global norm it clipped with
    # (path, path) pairs that must be one and the same Parameter after setup (facts["shared_params"]["a=b"]).
    shared_params: tuple = ()
    # how shards are sized (parity.observe.partition.SPLITS): "near_even" (AutoTP) or "chunk" (DTensor's Shard)
    split: str = "near_even"
    # True: every record is one computation from the reference's exact inputs (a loss-only subject), so its
    # checks are judged as stage-local ones (docs/subjects.md#the-subject-interface).
    stage_local: bool = False
    # False: the logits are a function of the head's product (a scale, a softcap): only loss[stage] applies.
    logits_from_head: bool = True


# The micro-batch records of a head whose logits stay vocabulary-sharded: each rank its block along the last dim.
LOCAL_LOGITS = {"logits": -1, "loss": None, "head_input_grad": None}


def head_claims(head: str, module: str, weight_dim, bias_dim=0, vocab_loss: bool = False, blocks=({}, {}),
                **more) -> Claims:
    """The tiny LM's claims where the head at ``head`` became ``module``: its weight sharded along ``weight_dim``,
    its bias along ``bias_dim`` (None: replicated). vocab_loss: VocabParallelCausalLMLoss is model.loss_function
    and the logits stay sharded. blocks: further (module_types, param_shards), the blocks' projections."""
    modules = {head: module, "proj": "Linear", "embed_tokens": "Embedding"}
    if vocab_loss:
        modules["loss_function"] = "VocabParallelCausalLMLoss"
        more.setdefault("micro_records", dict(LOCAL_LOGITS))
    return Claims(module_types={**modules, **blocks[0]},
                  param_shards={f"{head}.weight": weight_dim, f"{head}.bias": bias_dim, **blocks[1]}, **more)


# A Llama block's projections as AutoTP shards them: q/k/v and gate/up column (LinearLayer, weight cut on dim 0),
# o_proj and down_proj row (LinearAllreduce, cut on dim 1).
COLUMN_PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW_PROJ = ("self_attn.o_proj", "mlp.down_proj")


def projection_claims(prefix: str, blocks: int) -> tuple[dict, dict]:
    """(module_types, param_shards) of ``blocks`` Llama blocks under ``prefix`` (``layers``, ``model.layers``)."""
    types, shards = {}, {}
    for i in range(blocks):
        for names, cls, dim in ((COLUMN_PROJ, "LinearLayer", 0), (ROW_PROJ, "LinearAllreduce", 1)):
            for name in names:
                types[f"{prefix}.{i}.{name}"] = cls
                shards[f"{prefix}.{i}.{name}.weight"] = dim
    return types, shards


@dataclass
class RankContext:
    """Where a rank process stands; built once per process by the worker."""
    rank: int
    world_size: int
    device: str  # torch device of this rank: "cpu" or "cuda:N"
    mode: str = ""  # how ranks communicate, e.g. "2 ranks sharing cuda:0 over gloo"
    state: dict = field(default_factory=dict)  # per-process caches owned by subjects

    def tp_dp(self, tp: int) -> tuple[int, int]:
        # DeepSpeed's mesh is (dp, tp): TP groups are consecutive ranks.
        return self.rank % tp, self.rank // tp


class Subject(ABC):
    name: str = ""
    description: str = ""
    axes: dict = {}  # axis -> allowed values (None: the axis's whole domain), in case-id order
    defaults: dict = {}  # axis defaults that differ from parity.axes
    clean_state: dict = {}  # what reset_process_state must report before every case
    framework: str = ""  # the framework under test (parity.subjects.FRAMEWORKS), for --framework and its table
    # The frameworks table's row this subject's cases count in (None: no head feature); declared on every
    # subject's own class (docs/subjects.md#the-subject-interface).
    feature: str | None = None
    # Capabilities every case needs whatever its values; requires() adds those its values call for.
    capabilities: tuple = ()
    # Its mutation family (parity.mutation.catalog) is its name. reference_imports: modules the parent's
    # reference imports on first use, imported by a job before its first batch (job_body.warm_up).
    reference_imports: tuple = ()
    # True: every rank records what the framework decided there (facts["rank_decisions"]), checked against the
    # suite's formulas and across ranks (docs/checks.md#what-a-case-checks).
    records_rank_decisions: bool = False
    # Non-empty: where the case files document the framework's refusal of a vocabulary tp does not divide;
    # `parity explore` then draws no such point.
    refuses_uneven_vocab: str = ""

    def world_size(self, values: dict) -> int:
        return values["tp"] * values.optional("dp", 1) * values.optional("sp", 1)

    def invalid(self, values: dict) -> str | None:
        """Why these axis values make no case of this subject (a case file naming them is refused with it), or
        None. For combinations the axes' domains alone cannot rule out."""
        return None

    def decided(self, values: dict) -> dict:
        """Beyond the mesh formulas, what this case's configuration must make the framework decide on
        every rank (keys of facts["rank_decisions"]); checked with them where records_rank_decisions."""
        return {}

    def markers(self, values: dict) -> list[str]:
        device = values["device"]
        found = ["gpu" if device == "cuda" else "cpu", f"world{self.world_size(values)}"]
        if values.optional("backend", None) == "liger":
            found.append("liger")
        return found

    def requires(self, values: dict) -> list[str]:
        """The machine capabilities (parity.observe.capabilities) this case needs to run here at all."""
        return list(self.capabilities) + (["cuda"] if values["device"] == "cuda" else [])

    def unavailable_reason(self, values: dict) -> str | None:
        """Checked in the parent before a case runs; a reason makes the case a (reported) skip."""
        from parity.observe.capabilities import unavailable_reason

        return unavailable_reason(self.requires(values))

    def model_spec(self, values: dict) -> ModelSpec:
        return ModelSpec(vocab=values["vocab"], hidden=values["hidden"], bias=values.optional("bias", True),
                         head_name=values.optional("head", "lm_head"), tied=values.optional("tied", False),
                         reduction=values.optional("reduction", "mean"),
                         ignore_index=values.optional("ignore_index", -100),
                         label_smoothing=values.optional("label_smoothing", 0.0),
                         labels_form=values.optional("labels", "labels"))

    def reference(self, values: dict, compute_dtype=None):
        """The unsharded reference at the case dtype, or at ``compute_dtype`` (float64: the oracle)."""
        from parity.observe.dtypes import DTYPES
        from references.trajectory import train_reference

        autocast = values.optional("autocast", "off")
        return train_reference(self.model_spec(values), self.training_spec(values), DTYPES[values["dtype"]],
                               compute_dtype, autocast=None if autocast == "off" else DTYPES[autocast])

    def reference_key(self, values: dict):
        """What reference(values) depends on, hashable: cases with equal keys share one reference. None (never
        shared) for a subject that overrides reference() without saying what it depends on."""
        if type(self).reference is not Subject.reference:
            return None
        autocast = values.optional("autocast", "off")
        # Only a case with autocast on carries it: every other key (and the disk cache's entries) stays as it was.
        return ("train_reference", self.model_spec(values), self.training_spec(values), values["dtype"],
                *(() if autocast == "off" else (("autocast", autocast),)))

    def training_spec(self, values: dict) -> TrainingSpec:
        return TrainingSpec(seed=case_seed(TrainingSpec.seed, values), micro_batches=values["gas"],
                            ignore=values.optional("ignore", "scattered"),
                            dp=values.optional("dp", 1), clip=values.optional("clip", 0.0),
                            pad_token=padding_index(values))

    @abstractmethod
    def claims(self, values: dict) -> Claims:
        ...

    @abstractmethod
    def run_rank(self, values: dict, ctx: RankContext):
        """Runs inside rank process ``ctx.rank``; returns parity.observe.observations.RankObservations."""

    def records_state_after_rejection(self, values: dict) -> bool:
        """True: with the expected error every rank attaches ``parity_facts = {"state_before": ..., "state_after":
        ...}`` (parity.observe.model_state); the case fails unless they are equal or where a rank attached none."""
        return False

    def records_master_weights(self, values: dict) -> bool:
        """Whether this case's ranks record ("master_weight", step, None, name), the optimizer's float32 copy of
        each parameter, after each update (parity/checks/master_weights.py)."""
        return False

    def reset_process_state(self, ctx: RankContext) -> dict:
        """Undo process-global state a previous case may have left; return a snapshot proving it."""
        return {}


class NoModel:
    """Mixin first in the bases of a subject that trains no model: Subject.model_spec would read undeclared axes."""

    def model_spec(self, values):
        raise NotImplementedError(f"subject {self.name!r} builds no model: it has no model_spec")
