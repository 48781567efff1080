"""DeepSpeed 0.19.8 AutoTP on the causal-LM architectures of transformers 5.24, each built tiny (references/zoo.py).

The ``arch`` axis names the model_type; the model is ``references.zoo.build`` of it, trained on the ranks through
deepspeed.initialize (EngineHead, driven by parity/subjects/driver.py) with the model's own forward and its own
``loss_function`` (labels passed). The reference is the same class unsharded, its own forward and loss, through
references/trajectory.py train_reference. Claims are derived from the HF plan read off the built model, not from
DeepSpeed. How the engine reads the plan: docs/subjects.md#hf-tp_plan-heads; the zoo: docs/subjects.md#zoo-subjects.
"""
from __future__ import annotations

import functools
import inspect
import json
import re
from importlib.util import find_spec
from pathlib import Path

import torch

from parity.observe.dtypes import DTYPES
from parity.subjects.base import Claims
from parity.subjects.deepspeed_autotp import EngineHead
from parity.subjects.hf_tp_plan import effective_hf_plan
from references import zoo
from references.tiny_lm import ModelSpec
from references.trajectory import Trajectory, train_reference

# clip (quiet at 0: no case id changes) and gas 1 and 4: what `parity check` reads from a user's gradient_clipping and
# gradient_accumulation_steps (parity/matrix/user_config.py).
ZOO_AXES = {"arch": None, "vocab": (zoo.VOCAB,), "dtype": ("fp32", "bf16"), "zero": (0, 2), "gas": (1, 2, 4), "tp": (2,),
            "clip": None, "device": None}
CENSUS = Path(__file__).resolve().parents[2] / "results" / "zoo" / "census.json"
VOCAB_PARALLEL_MICRO = {"logits": -1, "loss": None, "head_input_grad": None}


@functools.lru_cache(maxsize=None)
def census_rows() -> dict:
    """model_type -> its row of results/zoo/census.json (empty where the file is absent: an installed wheel)."""
    if not CENSUS.is_file():
        return {}
    return {r["model_type"]: r for r in json.loads(CENSUS.read_text())["rows"]}


def hf_plan(model) -> dict:
    """The plan the model carries: config.base_model_tp_plan, then the class's and the instance's _tp_plan, later
    entries winning; a "model."-prefixed entry whose unprefixed pattern an earlier plan states is the same entry
    (transformers writes the base plan again, prefixed, into the instance plan)."""
    merged: dict = {}
    for plan in (getattr(model.config, "base_model_tp_plan", None), getattr(type(model), "_tp_plan", None),
                 model.__dict__.get("_tp_plan")):
        for pattern, style in (plan or {}).items():
            short = pattern[len("model."):] if pattern.startswith("model.") else pattern
            if pattern.startswith("model.") and short in {p[len("model."):] if p.startswith("model.") else p
                                                          for p in merged}:
                continue
            merged[pattern] = style
    return merged


def plan_style(plan: dict, module_path: str) -> str | None:
    """The style of the last plan entry whose pattern (``*`` any run of characters) ends ``module_path`` at a
    name boundary; None: the plan says nothing of it."""
    found = None
    for pattern, style in plan.items():
        regex = "(^|.*\\.)" + re.escape(pattern).replace("\\*", ".*") + "$"
        if re.match(regex, module_path):
            found = style.lower()
    return found


@functools.lru_cache(maxsize=None)
def planned(arch: str) -> dict:
    """What the claims are derived from, read off the built fp32 model: its head and embedding paths, whether they
    are tied, the plan, and every nn.Linear the plan names with that style."""
    model = zoo.build(arch)
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    plan = hf_plan(model)
    traits = zoo.traits(model)
    linears = {name: plan_style(plan, name) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m is not head}
    return {"head": zoo._module_path(model, head), "embedding": zoo._module_path(model, emb),
            "tied": head is not None and head.weight is emb.weight, "plan": plan,
            "head_bias": getattr(head, "bias", None) is not None,
            # The logits are a function of the head's product (softcap, logit scale), not the product itself.
            "logits_from_head": not (traits["softcap"] or traits["logit_scale"] not in (None, 1)
                                     or traits["logits_scaling"] not in (None, 1)),
            # DeepSpeed's documented rule for a vocabulary-parallel embedding (layers.py:1110-1120
            # VocabParallelEmbedding.validate_embedding): nn.Embedding's own forward, or Gemma3's scaled one.
            "embedding_shardable": (type(emb).forward is torch.nn.Embedding.forward
                                    or type(emb).__name__ == "Gemma3TextScaledWordEmbedding"),
            "linears": {n: s for n, s in linears.items() if s is not None},
            "vocab": zoo._text(model.config).vocab_size}


def freeze_other_towers(model) -> None:
    """A wrapper's towers that text-only batches never reach (vision, audio) are frozen, as a user fine-tuning the
    text side freezes them: they get no gradient, and an optimizer step would have nothing to apply."""
    if zoo._text(model.config) is model.config:
        return
    trained = {id(p) for m in (model.get_decoder(), model.get_output_embeddings()) for p in m.parameters()}
    for p in model.parameters():
        if id(p) not in trained:
            p.requires_grad_(False)


def layer_claims(linears: dict) -> tuple[dict, dict]:
    """Module types and parameter shards of the plan's layers: colwise (and the gathered styles) -> a column
    LinearLayer, weight and bias sharded on dim 0; rowwise -> LinearAllreduce, weight on dim 1, bias whole;
    replicated_with_grad_allreduce and embedding_rowwise on a Linear -> left whole (a skip spec)."""
    types, shards = {}, {}
    for name, style in linears.items():
        if style in ("colwise", "colwise_rep", "colwise_gather_output"):
            types[name] = "LinearLayer"
            shards.update({f"{name}.weight": 0, f"{name}.bias": 0})
        elif style == "rowwise":
            types[name] = "LinearAllreduce"
            shards.update({f"{name}.weight": 1, f"{name}.bias": None})
        elif style in ("replicated_with_grad_allreduce", "embedding_rowwise"):
            shards.update({f"{name}.weight": None, f"{name}.bias": None})
    return types, shards


def model_inputs(model, batch: dict) -> dict:
    """The forward's keyword arguments for one micro-batch: the ids, zero token_type_ids where the forward takes them
    (as references.zoo.forward_backward), and the labels."""
    kwargs = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        kwargs["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return kwargs


def move_media_ids(model) -> None:
    """A wrapper's own token ids (image, audio, ...) moved past the text vocabulary: the suite's batches draw ids
    from all of it, and a media token without its pixels is an error in a VLM; the batches stay the suite's."""
    text = zoo._text(model.config)
    if text is model.config:
        return
    media = zoo.special_ids(model.config) - zoo.special_ids(text)
    keys = [k for k, v in model.config.to_dict().items()
            if not isinstance(v, dict) and zoo._is_id_key(k) and v in media]
    for i, key in enumerate(sorted(keys)):
        setattr(model.config, key, text.vocab_size + 1000 + i)


class ZooHead(EngineHead):
    """A zoo architecture through deepspeed.initialize; subclasses say what DeepSpeed is told of the head."""
    axes = ZOO_AXES
    defaults = {"vocab": zoo.VOCAB}
    feature = None
    reference_imports = ("transformers.models.auto.modeling_auto",)

    # -- the model --------------------------------------------------------------------------------
    def info(self, values: dict) -> dict:
        return planned(values["arch"])

    def model_spec(self, values):
        info = self.info(values)
        return ModelSpec(vocab=values["vocab"], hidden=0, bias=info["head_bias"], head_name=info["head"],
                         tied=info["tied"])

    def build(self, values: dict, dtype: torch.dtype):
        model = zoo.build(values["arch"], dtype, self.training_spec(values).seed)
        vocab = zoo._text(model.config).vocab_size
        if vocab != values["vocab"]:  # the batches draw ids from values["vocab"]
            raise ValueError(f"{values['arch']}: the tiny config's vocabulary is {vocab}, the case's {values['vocab']}")
        move_media_ids(model)
        freeze_other_towers(model)
        return model

    def tensor_parallel_config(self, values):
        return {}  # no partition_config: the engine takes the model's HF plan (or, without one, its heuristic)

    def unavailable_reason(self, values):
        """An architecture whose census build failed is skipped by name with the census reason, so a case file
        may list every architecture (cases/zoo/full.toml)."""
        reason = super().unavailable_reason(values)
        if reason is None and find_spec("transformers") is None:
            reason = "transformers is not installed (pip install -e '.[hf]')"
        row = census_rows().get(values["arch"])
        if reason is None and row is not None and row["status"] != "built":
            reason = f"{values['arch']} cannot be built here (docs/zoo-census.md): {row['reason']}"
        return reason

    # -- parent: the unsharded reference ------------------------------------------------------------
    def reference(self, values: dict, compute_dtype=None) -> Trajectory:
        """The same class unsharded: its own forward and its own loss (labels passed)."""
        def forward(model, batch, num_items):
            out = model(**model_inputs(model, batch))
            return out.loss, out.logits

        return train_reference(self.model_spec(values), self.training_spec(values), DTYPES[values["dtype"]],
                               compute_dtype, build=lambda dtype: self.build(values, dtype), forward=forward,
                               capture=self.capture_head_input)

    # -- ranks --------------------------------------------------------------------------------------
    def forward(self, engine, batch, num_items, spec):
        out = engine(**model_inputs(engine.module, batch))
        return out.loss, out.logits

    def capture_head_input(self, model, sink):
        """The head's input and its gradient (references.tiny_lm.capture_head_input_and_grad), at the module the
        model's get_output_embeddings() returns (after AutoTP: the module that replaced the head)."""
        def pre_hook(module, args):
            sink["x"] = args[0].detach()
            args[0].register_hook(lambda grad: sink.__setitem__("h", grad))

        model.get_output_embeddings().register_forward_pre_hook(pre_hook)

    def model_facts(self, model):
        return {"hf_tp_plan": dict(effective_hf_plan(model))}

    # -- what DeepSpeed must build ------------------------------------------------------------------
    def vocab_parallel(self, values) -> bool:
        """The engine's auto path (engine.py:1113-1125, vocab_parallel_lm_head unset): a plan with an
        embedding_rowwise entry and a head tied to an embedding -> vocabulary-parallel head and embedding, unless
        the embedding is one DeepSpeed cannot shard (then both stay replicated, engine.py:1163-1177)."""
        info = self.info(values)
        return (info["tied"] and info["embedding_shardable"]
                and "embedding_rowwise" in {s.lower() for s in info["plan"].values()})

    def claims(self, values):
        info = self.info(values)
        head, emb = info["head"], info["embedding"]
        types, shards = layer_claims(info["linears"])
        if self.vocab_parallel(values):
            types.update({head: "VocabParallelLinear", "loss_function": "VocabParallelCausalLMLoss"})
            if info["tied"]:
                types[emb] = "VocabParallelEmbedding"
                shards[f"{emb}.weight"] = 0
            else:
                shards.update({f"{head}.weight": 0, f"{head}.bias": 0, f"{emb}.weight": None})
            return Claims(module_types=types, param_shards=shards, micro_records=VOCAB_PARALLEL_MICRO,
                          loss_backend="torch", logits_from_head=info["logits_from_head"],
                          shared_params=((f"{head}.weight", f"{emb}.weight"),) if info["tied"] else ())
        style = plan_style(info["plan"], head)
        if style in ("colwise_gather_output", "colwise_rep") and not info["tied"]:
            types[head], shards[f"{head}.weight"], shards[f"{head}.bias"] = "LinearLayer", 0, 0
        else:
            # A tied head the plan gathers: AutoTP's gathered-column tie fallback keeps head and embedding whole
            # (docs/subjects.md#hf-tp_plan-heads); a head the plan does not name stays a replicated nn.Linear.
            types[head], shards[f"{head}.weight"] = "Linear", None
        shards[f"{emb}.weight"] = None
        return Claims(module_types=types, param_shards=shards, logits_from_head=info["logits_from_head"],
                      shared_params=((f"{head}.weight", f"{emb}.weight"),) if info["tied"] else ())


class ZooHFPlan(ZooHead):
    name = "zoo_hf_plan"
    feature = None  # the head is gathered column, replicated or vocab-parallel by architecture: no one row
    description = ("A transformers architecture built tiny from its config class (arch), DeepSpeed AutoTP from the "
                   "model's own HF tp_plan (no partition_config), its own forward and loss_function; claims from "
                   "the plan.")


class ZooVocabParallel(ZooHead):
    name = "zoo_vocab_parallel"
    feature = "vocab-parallel head + CE"
    description = ("zoo_hf_plan with tensor_parallel.vocab_parallel_lm_head true: the head VocabParallelLinear (and a "
                   "tied embedding VocabParallelEmbedding), DeepSpeed's VocabParallelCausalLMLoss as the model's "
                   "loss_function.")

    def tensor_parallel_config(self, values):
        return {"vocab_parallel_lm_head": True}

    def vocab_parallel(self, values):
        return True
