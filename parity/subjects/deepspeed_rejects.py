"""DeepSpeed 0.19.8's documented error paths for output heads and vocabulary-parallel losses: ``ds_reject``'s
``variant`` axis names the rejection every rank must raise (docs/subjects.md#rejections)."""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from parity.subjects.base import Claims
from parity.observe.dtypes import DTYPES
from parity.observe.model_state import loss_function_repr, model_state, tensor_digest
from parity.subjects.deepspeed_autotp import (DeepSpeedSubject, EngineHead, deepspeed_process_state,
                                              install_tp_groups, setup_deepspeed, user_mpu)
from parity.subjects.deepspeed_autotp import skip_proj_specs as _specs
from parity.subjects.values import resolve
from references.seeding import seeded
from references.tiny_lm import ModelSpec, TinyCausalLM, TinyLlamaModel, build_model
from references.trajectory import TrainingSpec

VOCAB, HIDDEN, SEED, TOKENS, IGNORE_INDEX = 34, 32, 1234, 12, -100


def _strict(*specs) -> dict:
    """partition_config.strict_mode: every 2-D weight the AutoTP walk meets must match a spec."""
    return {"partition_config": {"use_default_specs": False, "strict_mode": True, "layer_specs": list(specs)}}


ROW_HEAD = {"patterns": [r"lm_head\.weight$"], "partition_type": "row"}
COLUMN_GATHERED = {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}
VOCAB_PARALLEL = {"vocab_parallel_lm_head": True, **_specs()}


# ---- model variants ------------------------------------------------------------------------------

class OutputNamedLM(TinyCausalLM):
    """The head is called ``output``: neither of the names (lm_head, embed_out) AutoTP's vocab-parallel
    head detection accepts."""

    def __init__(self, spec):
        super().__init__(spec)
        self.output = self.lm_head
        del self.lm_head
        self.spec = dataclasses.replace(spec, head_name="output")


class WeightHolder(nn.Module):
    """A non-Embedding module that holds the head's weight (e.g. an auxiliary scorer)."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight


class ReadOnlyLossLM(TinyCausalLM):
    """loss_function is a read-only property: the engine cannot install its vocab-parallel loss."""

    def __init__(self, spec):  # TinyCausalLM.__init__ assigns loss_function; build the same modules here
        nn.Module.__init__(self)
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden)
        self.proj = nn.Linear(spec.hidden, spec.hidden, bias=spec.bias)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=spec.bias)

    @property
    def loss_function(self):
        return None


class IgnoringSetterLossLM(ReadOnlyLossLM):
    """loss_function has a setter that silently drops the new value."""

    @property
    def loss_function(self):
        return None

    @loss_function.setter
    def loss_function(self, value):
        pass


class LlamaShapedLM(TinyLlamaModel):
    """TinyLlamaModel's blocks under a class name without "Model", for AutoTP's heuristic parser
    (docs/subjects.md#rejections)."""


def _hf_gpt2(spec):
    """transformers' own GPT2LMHeadModel, one block: no tp_plan, so AutoTP's heuristic parser refuses its family
    (docs/subjects.md#rejections)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    # bos/eos inside the small vocabulary: GPT-2's 50256 only draws a config warning
    config = GPT2Config(vocab_size=spec.vocab, n_embd=spec.hidden, n_layer=1, n_head=2, n_positions=TOKENS,
                        bos_token_id=spec.vocab - 1, eos_token_id=spec.vocab - 1)
    return _seeded(lambda: GPT2LMHeadModel(config))


def _seeded(factory):
    with seeded(SEED):
        return factory()


def _changed(change=None):
    """A model builder: the tiny LM as the reference builds it, then ``change(model, spec)`` made in place."""
    def build(spec):
        model = build_model(spec, SEED, torch.float32)
        if change is not None:
            change(model, spec)
        return model
    return build


def _embedding_option(**options):
    def change(model, spec):
        new = nn.Embedding(spec.vocab, spec.hidden, **options)
        new.weight = model.embed_tokens.weight  # keeps a tie to the head, if any
        model.embed_tokens = new
    return _changed(change)


_plain = _changed()
_tied_to_non_embedding = _changed(lambda model, spec: setattr(model, "scorer", WeightHolder(model.lm_head.weight)))
# loss_function is an instance attribute in TinyCausalLM: afterwards hasattr() is False
_without_loss_function = _changed(lambda model, spec: delattr(model, "loss_function"))


def _tp_plan_style(style):
    # DeepSpeed reads an instance's _tp_plan as a HuggingFace tp_plan (runtime/tensor_parallel/config.py).
    return _changed(lambda model, spec: setattr(model, "_tp_plan", {"lm_head": style}))


def _two_blocks(cls):
    return lambda spec: _seeded(lambda: cls(dataclasses.replace(spec, blocks=2)))


def _probe_ids(spec, seed: int = SEED) -> torch.Tensor:
    """The batch an accepted setup is probed with: two rows of six token ids."""
    return torch.randint(0, spec.vocab, (2, 6), generator=torch.Generator().manual_seed(seed))


def _second_head(path: str, tp_plan: bool = False):
    """A second [V, H] output head at ``path`` beside lm_head (a multi-token-prediction head); tp_plan: with an HF
    tp_plan for lm_head, so that the engine takes the plan's path."""
    def change(model, spec):
        *parents, leaf = path.split(".")
        owner = model
        for part in parents:
            owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        owner.add_module(leaf, _seeded(lambda: nn.Linear(spec.hidden, spec.vocab, bias=spec.bias)))
        if tp_plan:
            model._tp_plan = {"lm_head": "colwise_gather_output"}
    return _changed(change)


@dataclasses.dataclass(frozen=True)
class EngineVariant:
    """One engine rejection: what the user's config and model are, and what runs after an accepted initialize.
    Each field's meaning: docs/subjects.md#an-engine-variants-fields"""
    tp_config: dict
    build: object = _plain
    tied: bool = False
    vocab: object = VOCAB  # an int, or a callable tp -> int
    extra: dict = dataclasses.field(default_factory=dict)
    probe_logits: bool = False
    values: dict = dataclasses.field(default_factory=dict)
    user_tp: str = ""
    dp: int = 1
    tp_model_init: str = ""
    autotp_factor: int = 1
    compile_eager: bool = False
    autocast: dict = dataclasses.field(default_factory=dict)
    zero: dict = dataclasses.field(default_factory=dict)
    probe_preset: bool = False


@dataclasses.dataclass(frozen=True)
class CEVariant:
    fused: bool = False
    kwargs: dict = dataclasses.field(default_factory=dict)
    bounds: str = "explicit"  # explicit | none | start_only | all_zero
    vocab: object = VOCAB
    target_out_of_range: bool = False


ENGINE_VARIANTS = {  # why each: the comment above its case in cases/deepspeed_rejects.toml
    "tied_row_max_norm": EngineVariant(_specs(ROW_HEAD), _embedding_option(max_norm=1.0), tied=True),
    "tied_row_sparse": EngineVariant(_specs(ROW_HEAD), _embedding_option(sparse=True), tied=True),
    "tied_vocab_max_norm": EngineVariant(VOCAB_PARALLEL, _embedding_option(max_norm=1.0), tied=True),
    "tied_vocab_sparse": EngineVariant(VOCAB_PARALLEL, _embedding_option(sparse=True), tied=True),
    "tied_vocab_scale_grad": EngineVariant(VOCAB_PARALLEL, _embedding_option(scale_grad_by_freq=True), tied=True),
    "row_tied_non_embedding": EngineVariant(_specs(ROW_HEAD), _tied_to_non_embedding),
    "hf_plan_unsupported_style": EngineVariant({}, _tp_plan_style("sequence_parallel")),
    "hf_plan_colwise_head": EngineVariant({}, _tp_plan_style("colwise"), probe_logits=True),
    "row_shape": EngineVariant(_specs({**ROW_HEAD, "shape": [-1, HIDDEN], "partition_dim": 1})),
    "row_partition_dim0": EngineVariant(_specs({**ROW_HEAD, "partition_dim": 0})),
    "gather_shape": EngineVariant(_specs({**COLUMN_GATHERED, "shape": [2, -1], "partition_dim": 0})),
    "vocab_empty_shard": EngineVariant(VOCAB_PARALLEL, vocab=lambda tp: tp - 1),
    "vocab_no_head": EngineVariant(VOCAB_PARALLEL, OutputNamedLM),
    "liger_without_vocab_head": EngineVariant({"vocab_parallel_ce_backend": "liger", **_specs(COLUMN_GATHERED)}),
    "tp_size_mismatch": EngineVariant(_specs(COLUMN_GATHERED), extra={"tp_size_plus": 1}),
    "loss_function_missing": EngineVariant(VOCAB_PARALLEL, _without_loss_function),
    "loss_function_read_only": EngineVariant(VOCAB_PARALLEL, ReadOnlyLossLM),
    "loss_function_setter_ignored": EngineVariant(VOCAB_PARALLEL, IgnoringSetterLossLM),
    "column_no_gather": EngineVariant(_specs({"patterns": [r"lm_head\.weight$"], "partition_type": "column"}),
                                      probe_logits=True),
    "zero2_prescale": EngineVariant(VOCAB_PARALLEL, values={"zero": 2, "dp_reduce": "prescale"}),
    "zero2_predivide": EngineVariant(VOCAB_PARALLEL, values={"zero": 2, "dp_reduce": "predivide2"}),
    "zero3_prescale": EngineVariant(VOCAB_PARALLEL, values={"zero": 3, "dp_reduce": "prescale"}),
    "zero0_bf16_fp32_accum": EngineVariant(VOCAB_PARALLEL, values={"dtype": "bf16", "grad_accum": "fp32"}),
    "strict_unmatched_proj": EngineVariant(_strict(COLUMN_GATHERED)),
    "strict_unmatched_head": EngineVariant(_strict({"patterns": [r"proj\.weight$"], "partition_type": "column"})),
    "heuristic_unnamed_model": EngineVariant({"vocab_parallel_lm_head": True}, _two_blocks(LlamaShapedLM)),
    "heuristic_gpt2_family": EngineVariant({}, _hf_gpt2),
    "heuristic_gpt2_vocab_head": EngineVariant({"vocab_parallel_lm_head": True}, _hf_gpt2),
    "preset_unknown_name": EngineVariant({"preset_model": "mistral"}, _two_blocks(TinyLlamaModel), probe_preset=True),
    "preset_llama_gqa": EngineVariant({"preset_model": "llama_gqa"}, _two_blocks(TinyLlamaModel), probe_preset=True),
    "spec_key_gather_outputs": EngineVariant(_specs({"patterns": [r"lm_head\.weight$"], "partition_type": "column",
                                                     "gather_outputs": True}), probe_logits=True),
    "spec_key_pattern": EngineVariant(_specs({"pattern": r"lm_head\.weight$", "partition_type": "column",
                                              "gather_output": True}), probe_logits=True),
    "vocab_two_heads": EngineVariant({**VOCAB_PARALLEL, **_specs(lm_head_patterns=["lm_head", "mtp_head"])},
                                     _second_head("mtp_head")),
    "vocab_nested_heads": EngineVariant(VOCAB_PARALLEL, _second_head("mtp.lm_head")),
    "heuristic_two_heads": EngineVariant({"vocab_parallel_lm_head": True}, _second_head("mtp.lm_head")),
    "hf_plan_two_heads": EngineVariant({"vocab_parallel_lm_head": True}, _second_head("mtp.lm_head", tp_plan=True)),
    "user_tp_group_tp_model_init": EngineVariant(_specs(COLUMN_GATHERED), user_tp="tp_model_init", dp=2),
    "user_tp_group_config": EngineVariant(_specs(COLUMN_GATHERED), user_tp="config", dp=2),
    "user_tp_group_mpu": EngineVariant(_specs(COLUMN_GATHERED), user_tp="mpu", dp=2),
    "tp_model_init_size_conflict": EngineVariant(_specs(COLUMN_GATHERED), tp_model_init="fp32", autotp_factor=2),
    "tp_model_init_dtype_conflict": EngineVariant(_specs(COLUMN_GATHERED), tp_model_init="fp32",
                                                  values={"dtype": "bf16"}),
    "tp_model_init_dtype_unchecked": EngineVariant(_specs(COLUMN_GATHERED), tp_model_init="bf16"),
    "compile_autotp_eager_column": EngineVariant(_specs(COLUMN_GATHERED), compile_eager=True),
    "compile_autotp_row_head": EngineVariant(_specs(ROW_HEAD), compile_eager=True),
    "autocast_unknown_module": EngineVariant(VOCAB_PARALLEL, values={"autocast": "bf16", "zero": 1}, autocast={
        "lower_precision_safe_modules": ["torch.nn.modules.linear.Linear",
                                         "deepspeed.module_inject.layers.VocabParallelLinaer"]}),
    "autocast_zero_quantized_weights": EngineVariant(VOCAB_PARALLEL, values={"autocast": "bf16", "zero": 3},
                                                     zero={"zero_quantized_weights": True}),
}

CE_VARIANTS = {
    "ce_bad_reduction": CEVariant(kwargs={"reduction": "avg"}),
    "ce_bad_backend": CEVariant(kwargs={"backend": "triton"}),
    "ce_uneven_no_bounds": CEVariant(bounds="none", vocab=lambda tp: 17 * tp + 1),
    "ce_start_without_end": CEVariant(bounds="start_only"),
    "ce_target_out_of_range": CEVariant(target_out_of_range=True),
    "ce_empty_shard": CEVariant(vocab=lambda tp: tp - 1),
    "ce_overlapping_bounds": CEVariant(bounds="all_zero"),
    "fused_bad_reduction": CEVariant(fused=True, kwargs={"reduction": "avg"}),
    "fused_size_zero": CEVariant(fused=True, kwargs={"chunk_size": 0}),
    "fused_start_without_end": CEVariant(fused=True, bounds="start_only"),
    "fused_target_out_of_range": CEVariant(fused=True, target_out_of_range=True),
}

VARIANTS = ("none", *ENGINE_VARIANTS, *CE_VARIANTS)


def _engine_state(model) -> dict:
    """The model the user passed to deepspeed.initialize, and AutoTP's process-global switches."""
    return model_state(model, loss_function=loss_function_repr(model), **deepspeed_process_state())


def _call_state(inputs: dict) -> dict:
    state = {f"input[{k}]": (tuple(t.shape), str(t.dtype), tensor_digest(t)) for k, t in inputs.items()}
    return {**state, **{f"extra[{k}]": repr(v) for k, v in deepspeed_process_state().items()}}


def _vocab(value, tp: int) -> int:
    return value(tp) if callable(value) else value


def user_groups(ctx, tp: int, dp: int) -> tuple:
    """This rank's (TP, DP) groups of the user's strided layout, made once per process (new_group is
    collective, and a group per case would leak gloo groups in a pooled rank)."""
    import torch.distributed as tdist

    cache = ctx.state["deepspeed"].setdefault("user_groups", {})
    if (tp, dp) not in cache:
        tps = [tdist.new_group([d + dp * t for t in range(tp)]) for d in range(dp)]
        dps = [tdist.new_group([dp * t + d for d in range(dp)]) for t in range(tp)]
        cache[(tp, dp)] = tps, dps
    tps, dps = cache[(tp, dp)]
    return tps[ctx.rank % dp], dps[ctx.rank // dp]


class _Config(EngineHead):
    """Only for EngineHead.ds_config: the engine settings every training subject uses."""
    name = "_ds_reject_config"

    def __init__(self, tp_config):
        self._tp_config = tp_config

    def tensor_parallel_config(self, values):
        return self._tp_config

    def claims(self, values):  # pragma: no cover - never a subject
        raise NotImplementedError


class DeepSpeedRejection(DeepSpeedSubject):
    name = "ds_reject"
    feature = None
    description = ("DeepSpeed's documented error paths: deepspeed.initialize (or the vocabulary-parallel CE) "
                   "with a model or config it must refuse, on every rank alike.")
    axes = {"variant": VARIANTS[1:], "tp": None, "device": None}

    def claims(self, values):
        return Claims(module_types={}, param_shards={})

    def world_size(self, values):
        variant = ENGINE_VARIANTS.get(values["variant"])
        return values["tp"] * (variant.dp if variant else 1)

    def model_spec(self, values):
        variant = ENGINE_VARIANTS[values["variant"]]
        return ModelSpec(vocab=_vocab(variant.vocab, values["tp"]), hidden=HIDDEN, tied=variant.tied)

    def training_spec(self, values):
        return TrainingSpec(steps=1, micro_batches=1)

    def records_state_after_rejection(self, values) -> bool:
        # Every variant: the model (engine variants) or the CE's inputs, and AutoTP's process switches.
        return True

    def run_rank(self, values, ctx):
        setup_deepspeed(ctx)
        name = values["variant"]
        if name in ENGINE_VARIANTS:
            self._initialize(ENGINE_VARIANTS[name], values, ctx)
        else:
            self._cross_entropy(CE_VARIANTS[name], values, ctx)
        raise AssertionError(f"variant {name!r} was accepted: DeepSpeed raised nothing")

    def _initialize(self, variant: EngineVariant, values, ctx):
        import deepspeed

        tp = values["tp"]
        install_tp_groups(ctx, tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        model = variant.build(spec).to(ctx.device)
        holder = _Config(variant.tp_config)
        config = holder.ds_config(resolve(holder, {"tp": tp, "zero": 0, "dtype": "fp32", **variant.values}), train)
        if variant.compile_eager:
            config["compile"] = {"deepcompile": True, "passes": ["autotp"]}
        config.get("torch_autocast", {}).update(variant.autocast)
        config["zero_optimization"].update(variant.zero)
        if "tp_size_plus" in variant.extra:
            config["tensor_parallel"]["tp"]["tp_size"] = tp + variant.extra["tp_size_plus"]
        if variant.tp_model_init:
            config["tensor_parallel"]["autotp_size"] = tp * variant.autotp_factor
            deepspeed.tp_model_init(model, tp_size=tp, dtype=DTYPES[variant.tp_model_init])
        # After the user's own tp_model_init (its record and training mode): only what initialize leaves counts.
        before = _engine_state(model)
        mpu = user_tp = None
        if variant.user_tp:
            user_tp, user_dp = user_groups(ctx, tp, variant.dp)
            if variant.user_tp == "tp_model_init":
                # As a user would: tp_model_init supplies tp_size (and the group); the config leaves them out.
                del config["tensor_parallel"]["autotp_size"]
                deepspeed.tp_model_init(model, tp_size=tp, dtype=torch.float32, tp_group=user_tp)
            elif variant.user_tp == "config":
                config["tensor_parallel"].setdefault("tp", {})["tp_group"] = user_tp
            else:
                # A Megatron-style mpu over the user's strided layout; tensor_model_* alias model_*.
                tp_answers = {"group": user_tp, "world_size": tp, "rank": ctx.rank // variant.dp}
                dp_answers = {"group": user_dp, "world_size": variant.dp, "rank": ctx.rank % variant.dp}
                mpu = user_mpu(**{f"{kind}_parallel_{key}": value for kind, answers in
                                  (("model", tp_answers), ("tensor_model", tp_answers), ("data", dp_answers))
                                  for key, value in answers.items()})
        try:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), mpu=mpu,
                                              optimizer=lambda p: torch.optim.SGD(p, lr=train.lr), config=config)
        except Exception as exc:
            # The user still holds ``model``: what the refused call left of it is part of the verdict.
            exc.parity_facts = {"state_before": before, "state_after": _engine_state(model)}
            raise
        try:
            if user_tp is not None:
                self._probe_user_groups(engine, model, spec, ctx, user_tp, variant.dp, before)
            if variant.probe_preset or variant.probe_logits:
                with torch.no_grad():
                    _, logits = engine(input_ids=_probe_ids(spec).to(ctx.device))
            if variant.probe_preset:
                specs = engine._config.tensor_parallel_config.get_partition_config_object()
                o_proj = type(engine.module.layers[0].self_attn.o_proj).__name__
                raise AssertionError(
                    f"accepted: preset_model {variant.tp_config['preset_model']!r} gave "
                    f"{'no partition config' if specs is None else f'{len(specs.layer_specs)} layer specs'}, the "
                    f"engine took AutoTP's heuristic parser (layers.0.self_attn.o_proj became {o_proj}) and the "
                    f"first forward ran")
            if variant.probe_logits:
                raise AssertionError(f"accepted: the model got logits of shape {tuple(logits.shape)} for a "
                                     f"vocabulary of {spec.vocab} ({type(engine.module.lm_head).__name__})")
            if variant.compile_eager:
                self._eager_after_compile(engine, model, spec, ctx)
            if variant.tp_model_init:
                raise AssertionError(f"accepted: tp_model_init(dtype={DTYPES[variant.tp_model_init]}), the engine "
                                     f"trains lm_head in {engine.module.lm_head.weight.dtype}")
        finally:
            engine.destroy()

    def _eager_after_compile(self, engine, model, spec, ctx):
        """After engine.compile() an eager forward would drop the TP collectives, so it must raise; the state is
        taken after compile() (docs/subjects.md#rejections)."""
        import torch._dynamo

        engine.compile()
        before = _engine_state(model)
        try:
            with torch._dynamo.config.patch(disable=True):
                _, logits = engine(input_ids=_probe_ids(spec).to(ctx.device))
        except Exception as exc:
            exc.parity_facts = {"state_before": before, "state_after": _engine_state(model)}
            raise
        raise AssertionError(f"accepted: the eager forward after engine.compile() returned logits of shape "
                             f"{tuple(logits.shape)} ({type(engine.module.lm_head).__name__})")

    def _probe_user_groups(self, engine, model, spec, ctx, user_tp, dp, before):
        """Accepted: say which groups this rank's engine took, and what the user's first step (one batch
        per DP index of the user's layout) gets from them."""
        import torch.distributed as tdist
        from deepspeed.utils import groups

        members = tdist.get_process_group_ranks
        used = (f"user's TP group {members(user_tp)}; lm_head sharded over {members(engine.module.lm_head.mp_group)}, "
                f"DeepSpeed's TP group {members(groups.get_tensor_model_parallel_group())}, engine DP group "
                f"{members(engine.seq_data_parallel_group)}")
        ids = _probe_ids(spec, SEED + ctx.rank % dp)
        try:
            loss, _ = engine(input_ids=ids.to(ctx.device), labels=ids.to(ctx.device))
            engine.backward(loss)
            outcome = "the first forward and backward ran"
        except Exception as exc:
            outcome = f"the first forward raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        error = AssertionError(f"accepted: {used}; {outcome}")
        error.parity_facts = {"state_before": before, "state_after": _engine_state(model)}
        raise error

    def _cross_entropy(self, variant: CEVariant, values, ctx):
        from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy
        from deepspeed.sequence.linear_cross_entropy import vocab_parallel_linear_cross_entropy

        from parity.observe.partition import shard_slice
        from parity.subjects.loss_only import tp_group

        tp = values["tp"]
        group = tp_group(ctx, tp)
        tp_rank = ctx.tp_dp(tp)[0]
        vocab = _vocab(variant.vocab, tp)
        part = shard_slice(vocab, tp, tp_rank)
        gen = torch.Generator().manual_seed(SEED)
        targets = torch.randint(0, max(vocab, 1), (TOKENS,), generator=gen)
        if variant.target_out_of_range:
            targets[3] = vocab  # one past the last vocabulary row, on every rank alike
        bounds = {"explicit": {"vocab_start_index": part.start, "vocab_end_index": part.stop},
                  "none": {},
                  "start_only": {"vocab_start_index": part.start},
                  "all_zero": {"vocab_start_index": 0, "vocab_end_index": part.stop - part.start}}[variant.bounds]
        kwargs = {"tp_group": group, "ignore_index": IGNORE_INDEX, **bounds, **variant.kwargs}
        if variant.fused:
            hidden = torch.randn(TOKENS, 16, generator=gen)
            weight = torch.randn(vocab, 16, generator=gen)[part].contiguous()
            inputs = {"hidden": hidden.to(ctx.device), "weight": weight.to(ctx.device),
                      "target": targets.to(ctx.device)}
            call = vocab_parallel_linear_cross_entropy
        else:
            logits = torch.randn(TOKENS, vocab, generator=gen)[:, part].contiguous()
            inputs = {"vocab_parallel_logits": logits.to(ctx.device), "target": targets.to(ctx.device)}
            call = vocab_parallel_cross_entropy
        before = _call_state(inputs)
        try:
            call(**inputs, **kwargs)
        except Exception as exc:
            # A refused call must not have written into its inputs (the CE works in place on some paths).
            exc.parity_facts = {"state_before": before, "state_after": _call_state(inputs)}
            raise
