"""DeepSpeed 0.19.8 AutoTP driven by a tiny local LlamaForCausalLM's own tp_plan (no partition_config), against
the same model trained unsharded (docs/subjects.md#hf-tp_plan-heads)."""
from __future__ import annotations

import dataclasses
from importlib.util import find_spec

import torch

from parity.subjects.base import LOCAL_LOGITS, Claims, projection_claims
from parity.subjects.deepspeed_autotp import EngineHead
from parity.observe.dtypes import DTYPES
from references.loss import causal_lm_loss
from references.seeding import seeded
from references.tiny_lm import capture_head_input_and_grad
from references.trajectory import Trajectory, train_reference

HF_AXES = {"dtype": None, "reduction": ("mean", "num_items"), "vocab": None, "ignore": None, "zero": (0, 1, 2),
           "gas": None, "tp": (2,), "device": None}
HIDDEN, INTERMEDIATE, HEADS, LAYERS = 32, 64, 2, 1
INIT_STD = 0.1  # HF's default 0.02 gives near-uniform softmaxes; 0.1 keeps every check away from zero


def build_hf_model(values: dict, seed: int, dtype: torch.dtype):
    """Initial weights depend only on (values, seed): drawn in fp32, then cast (as references.tiny_lm)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=values["vocab"], hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         tie_word_embeddings=values.optional("tied", False), initializer_range=INIT_STD,
                         attn_implementation="eager")
    with seeded(seed):
        return LlamaForCausalLM(config).to(dtype)


def capture_lm_head_input_and_grad(model, sink: dict) -> None:
    capture_head_input_and_grad(model, sink, model.lm_head)


class HFPlanHead(EngineHead):
    """Engine loop over a HF model: ``engine(input_ids=..., labels=...)`` returns a ModelOutput."""

    axes = HF_AXES
    reference_imports = ("transformers.models.llama.modeling_llama",)

    def lm_head_style(self, values: dict) -> str | None:
        return None  # None: the plan transformers wrote

    def model_spec(self, values):
        spec = super().model_spec(values.widened(hidden=HIDDEN, bias=False))
        return dataclasses.replace(spec, tied=values.optional("tied", False))

    def tensor_parallel_config(self, values):
        # No partition_config: the engine's source priority then takes the HF tp_plan.
        return {}

    def unavailable_reason(self, values):
        reason = super().unavailable_reason(values)
        if reason is None and find_spec("transformers") is None:
            reason = "transformers is not installed (pip install -e '.[hf]')"
        return reason

    def build(self, values: dict, dtype: torch.dtype):
        model = build_hf_model(values, self.training_spec(values).seed, dtype)
        style = self.lm_head_style(values)
        if style is not None:
            model._tp_plan = {**model._tp_plan, "lm_head": style}
        return model

    # -- parent: the unsharded reference -------------------------------------------------------
    def reference(self, values: dict, compute_dtype=None) -> Trajectory:
        """references/trajectory.py's training of the same transformers model: its HF forward's logits (labels not
        passed) under the suite's own CE (references/loss.py)."""
        spec = self.model_spec(values)

        def forward(model, batch, num_items):
            logits = model(input_ids=batch["input_ids"]).logits
            return causal_lm_loss(logits, batch["labels"], reduction=spec.reduction, ignore_index=spec.ignore_index,
                                  num_items_in_batch=num_items), logits

        return train_reference(spec, self.training_spec(values), DTYPES[values["dtype"]], compute_dtype,
                               build=lambda dtype: self.build(values, dtype), forward=forward,
                               capture=capture_lm_head_input_and_grad)

    # -- ranks: the engine's training (EngineHead), with the HF model's interface ----------------
    def forward(self, engine, batch, num_items, spec):
        # HF's loss takes num_items_in_batch only from a trainer that counts tokens.
        extra = {"num_items_in_batch": num_items} if spec.reduction == "num_items" else {}
        out = engine(input_ids=batch["input_ids"], labels=batch["labels"], **extra)
        return out.loss, out.logits

    def capture_head_input(self, model, sink):
        capture_lm_head_input_and_grad(model, sink)

    def model_facts(self, model):
        return {"hf_tp_plan": dict(effective_hf_plan(model))}


def effective_hf_plan(model) -> dict:
    from deepspeed.runtime.tensor_parallel.config import _get_hf_tp_plan

    return _get_hf_tp_plan(model) or {}


class HFPlanColumnHead(HFPlanHead):
    name = "hf_plan_column"
    feature = "column head (gathered logits)"
    description = ("HF tp_plan path: lm_head 'colwise_gather_output' (or the old name 'colwise_rep') -> "
                   "column-parallel LinearLayer with gathered output; attention/MLP sharded by the model's plan; "
                   "HF's loss on full logits.")
    axes = {**HF_AXES, "hf_head": ("colwise_gather_output", "colwise_rep"), "model_init": ("plain", "tp_model_init")}

    def lm_head_style(self, values):
        return values["hf_head"]

    def claims(self, values):
        types, shards = projection_claims("model.layers", LAYERS)
        return Claims(module_types={"lm_head": "LinearLayer", "model.embed_tokens": "Embedding", **types},
                      param_shards={"lm_head.weight": 0, **shards})


class HFPlanRowHead(HFPlanHead):
    name = "hf_plan_row"
    feature = "row head"
    description = ("HF tp_plan path: lm_head 'rowwise' -> LinearAllreduceWithReplicatedInput (weight sharded on "
                   "hidden), full logits; attention/MLP sharded by the model's plan; HF's loss.")
    axes = HF_AXES

    def lm_head_style(self, values):
        return "rowwise"

    def claims(self, values):
        types, shards = projection_claims("model.layers", LAYERS)
        return Claims(module_types={"lm_head": "LinearAllreduceWithReplicatedInput", "model.embed_tokens": "Embedding",
                                    **types}, param_shards={"lm_head.weight": 1, **shards})


TIED = (("lm_head.weight", "model.embed_tokens.weight"),)


class HFPlanTiedHead(HFPlanHead):
    name = "hf_plan_tied"
    feature = "tied embedding / head"
    description = ("HF tp_plan path, tied embeddings, embedding_rowwise + lm_head colwise_gather_output: "
                   "vocab_parallel_lm_head true/unset -> VocabParallelLinear + VocabParallelEmbedding (one shard, "
                   "DeepSpeed's CE); false -> head and embedding left replicated and tied.")
    axes = {**HF_AXES, "vocab_parallel_lm_head": None, "model_init": ("plain", "tp_model_init")}

    def model_spec(self, values):
        return dataclasses.replace(super().model_spec(values), tied=True)

    def build(self, values, dtype):
        model = super().build(values.widened(tied=True), dtype)
        # transformers 5.24 writes this entry itself; stated here so the case does not depend on it.
        model._tp_plan = {**model._tp_plan, "model.embed_tokens": "embedding_rowwise"}
        return model

    def vocab_parallel(self, values) -> bool:
        return values["vocab_parallel_lm_head"] in ("true", "unset")

    def tensor_parallel_config(self, values):
        setting = values["vocab_parallel_lm_head"]
        return {} if setting == "unset" else {"vocab_parallel_lm_head": setting == "true"}

    def claims(self, values):
        types, shards = projection_claims("model.layers", LAYERS)
        if self.vocab_parallel(values):
            return Claims(module_types={"lm_head": "VocabParallelLinear", "model.embed_tokens": "VocabParallelEmbedding",
                                        "loss_function": "VocabParallelCausalLMLoss", **types},
                          param_shards={"model.embed_tokens.weight": 0, **shards}, micro_records=dict(LOCAL_LOGITS),
                          loss_backend="torch", shared_params=TIED)
        return Claims(module_types={"lm_head": "Linear", "model.embed_tokens": "Embedding", **types},
                      param_shards={"model.embed_tokens.weight": None, **shards}, shared_params=TIED)
