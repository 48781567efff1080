"""Megatron-core 0.16.1 tensor-parallel layers (``megatron.core.tensor_parallel``) on the tiny LM, built as a
Megatron user does around the reference's weights and trained by the driver (docs/subjects.md#megatron-core)."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from parity.observe.dtypes import DTYPES
from parity.observe.observations import RankObservations
import parity.subjects.driver as driver  # the module, not the package: no import cycle
from parity.subjects.base import LOCAL_LOGITS, Claims, RankContext, Subject
from parity.subjects.driver import record_structure
from parity.subjects.plain_sgd import PlainSGDHead
from references.tiny_lm import build_model, capture_head_input_and_grad

MEGATRON_AXES = {"dtype": ("fp32", "bf16", "fp16"), "reduction": None, "vocab": None, "hidden": None, "bias": None,
                 "ignore": None, "gas": None, "tp": None, "device": None}
CLEAN_STATE = {"model_parallel_initialized": False, "tensor_model_parallel_group": None}


def _megatron():
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": expected here
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.model_parallel_config import ModelParallelConfig
    return parallel_state, tensor_parallel, ModelParallelConfig


def process_state() -> dict:
    parallel_state, _, _ = _megatron()
    group = parallel_state._TENSOR_MODEL_PARALLEL_GROUP
    return {"model_parallel_initialized": parallel_state.model_parallel_is_initialized(),
            "tensor_model_parallel_group": None if group is None else f"size {group.size()}"}


def _no_init(weight):
    """Megatron wants an init_method; the reference's weights are copied in afterwards."""


def as_model_head(layer, weight_of=None):
    """Make a ColumnParallelLinear usable as ``self.head(h)``: hooks hand on its output and keep the reference's
    parameter names; ``weight_of`` (tied): the module whose weight it projects with (docs/subjects.md#megatron-core)."""
    layer.register_forward_hook(lambda module, args, out: out[0])
    if weight_of is not None:
        layer.register_forward_pre_hook(lambda module, args, kwargs: (args, {**kwargs, "weight": weight_of.weight}),
                                        with_kwargs=True)
    return layer


class MegatronHead(PlainSGDHead, Subject):
    """Builds Megatron layers around the reference's weights; the driver trains them with plain SGD."""

    axes = MEGATRON_AXES
    clean_state = CLEAN_STATE
    framework = "megatron"
    capabilities = ("megatron_core",)
    gathers = False  # ColumnParallelLinear(gather_output=True): CUDA only
    vocab_parallel_loss = False
    refuses_uneven_vocab = ("Megatron-core shards evenly and asserts tp divides the vocabulary at layer construction "
                            "(cases/megatron.toml: the uneven-vocabulary refusals)")

    def requires(self, values):
        found = super().requires(values)  # capabilities first: megatron_core
        if self.gathers:
            # torch.cuda.current_device() in Megatron's all-gather; and ranks sharing one GPU over gloo
            # crash in its CUDA all-gather (pytorch/pytorch#152645), so one GPU per rank.
            found += [] if "cuda" in found else ["cuda"]
            found.append(f"gpus{self.world_size(values)}")
        return found

    def reset_process_state(self, ctx: RankContext) -> dict:
        parallel_state, _, _ = _megatron()
        parallel_state.destroy_model_parallel()
        return process_state()

    def config(self, dtype):
        _, _, ModelParallelConfig = _megatron()
        tp = _megatron()[0].get_tensor_model_parallel_world_size()
        return ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True,
                                   perform_initialization=False, params_dtype=dtype)

    def install(self, model, values, dtype, tp_rank, tp):
        """The head as a ColumnParallelLinear with the reference's weights: gathered logits, or vocab-sharded ones."""
        layer = self.column_layer(model.spec, dtype, gather=self.gathers)
        self.copy_head(layer, model.head, tp_rank, tp)
        model.replace_head(as_model_head(layer))

    def claims(self, values):
        return Claims(module_types={"lm_head": "ColumnParallelLinear", "embed_tokens": "Embedding", "proj": "Linear"},
                      param_shards={"lm_head.weight": 0, "lm_head.bias": 0}, split="chunk",
                      **({} if self.gathers else {"micro_records": dict(LOCAL_LOGITS)}))

    def loss(self, model, logits, batch, num_items):
        """Megatron's per-token vocab-parallel CE, masked and reduced as pretrain_gpt's loss_func does."""
        _, tensor_parallel, _ = _megatron()
        spec = model.spec
        # HF's causal shift done on the labels (pad, then drop the first), so the sharded logits are not sliced.
        labels = F.pad(batch["labels"], (0, 1), value=spec.ignore_index)[..., 1:]
        mask = (labels != spec.ignore_index).float()
        per_token = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels,
                                                                 label_smoothing=spec.label_smoothing)
        masked = per_token * mask
        if spec.reduction == "none":
            return masked[..., :-1]
        total = masked.sum()
        if spec.reduction == "sum":
            return total
        if spec.reduction == "num_items":
            return total / max(int(num_items), 1)
        # The schedule's forward_step (pipeline_parallel/schedules.py) divides by torch.clamp(num_tokens, min=1):
        # an all-masked micro-batch gives 0, not 0/0.
        return total / mask.sum().clamp(min=1)

    def forward(self, model, batch, num_items):
        if not (self.vocab_parallel_loss or model.spec.tied):  # tied: GPTModel's shared head keeps logits sharded
            return model(**batch, num_items_in_batch=num_items)
        _, logits = model(batch["input_ids"])
        return self.loss(model, logits, batch, num_items), logits

    def run_rank(self, values: dict, ctx: RankContext) -> RankObservations:
        parallel_state, _, _ = _megatron()
        tp = values["tp"]
        if ctx.world_size != tp:
            raise ValueError(f"megatron subjects run with world size == tp; got world {ctx.world_size}, tp {tp}")
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
        try:
            return self._train(values, ctx, tp)
        finally:
            parallel_state.destroy_model_parallel()

    def _train(self, values, ctx, tp):
        tp_rank, dp_rank = ctx.tp_dp(tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        model = build_model(spec, train.seed, dtype)
        self.install(model, values, dtype, tp_rank, tp)
        model.to(ctx.device)
        captured: dict = {}
        capture_head_input_and_grad(model, captured)
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        record_structure(obs, model, self.claims(values))
        return driver.train(driver.Run(obs, train, lambda batch, n: self.forward(model, batch, n),
                                       driver.PlainUpdate.sgd(model, dtype, train.lr),
                                       driver.lm_batches(train, spec, dp_rank, ctx.device), spec.reduction,
                                       captured=captured, record_collectives=True))

    @staticmethod
    def shard(tensor, tp_rank, tp):
        """Megatron's layout: rank r holds rows [r*V/tp, (r+1)*V/tp) (VocabUtility; even only)."""
        return tensor.chunk(tp, dim=0)[tp_rank]

    def column_layer(self, spec, dtype, gather, skip_weight=False):
        _, tensor_parallel, _ = _megatron()
        return tensor_parallel.ColumnParallelLinear(spec.hidden, spec.vocab, config=self.config(dtype),
                                                    init_method=_no_init, bias=spec.bias, gather_output=gather,
                                                    skip_weight_param_allocation=skip_weight)

    def copy_head(self, layer, head, tp_rank, tp, weight=True):
        with torch.no_grad():
            if weight:
                layer.weight.copy_(self.shard(head.weight, tp_rank, tp))
            if head.bias is not None:
                layer.bias.copy_(self.shard(head.bias, tp_rank, tp))



class MegatronColumnGatheredHead(MegatronHead):
    name = "megatron_column_gathered"
    feature = "column head (gathered logits)"
    description = ("ColumnParallelLinear(gather_output=True) head: weight and bias sharded along vocab, logits "
                   "all-gathered, the suite's CE; plain SGD. CUDA only (Megatron's all-gather allocates on CUDA).")
    gathers = True


class MegatronVocabParallelHead(MegatronHead):
    name = "megatron_vocab_parallel"
    feature = "vocab-parallel head + CE"
    description = ("ColumnParallelLinear(gather_output=False) + tensor_parallel.vocab_parallel_cross_entropy "
                   "(per-token, masked and reduced as pretrain_gpt's loss_func); plain SGD.")
    axes = {**MEGATRON_AXES, "label_smoothing": None}
    vocab_parallel_loss = True


class MegatronVocabParallelEmbedding(MegatronHead):
    name = "megatron_vocab_embedding"
    feature = "vocab-parallel embedding"
    description = ("VocabParallelEmbedding (masked lookup + all-reduce). Untied: plain head, the suite's CE; tied "
                   "(GPTModel's share_embeddings_and_output_weights): ColumnParallelLinear("
                   "skip_weight_param_allocation=True) on the embedding's shard + vocab_parallel_cross_entropy.")
    axes = {**MEGATRON_AXES, "tied": None}

    def install(self, model, values, dtype, tp_rank, tp):
        _, tensor_parallel, _ = _megatron()
        spec = model.spec
        embedding = tensor_parallel.VocabParallelEmbedding(spec.vocab, spec.hidden, init_method=_no_init,
                                                           config=self.config(dtype))
        with torch.no_grad():
            embedding.weight.copy_(self.shard(model.embed_tokens.weight, tp_rank, tp))
        model.embed_tokens = embedding
        if spec.tied:
            layer = self.column_layer(spec, dtype, gather=False, skip_weight=True)
            self.copy_head(layer, model.head, tp_rank, tp, weight=False)
            model.replace_head(as_model_head(layer, weight_of=embedding))

    def claims(self, values):
        if values["tied"]:
            return Claims(module_types={"embed_tokens": "VocabParallelEmbedding", "proj": "Linear",
                                        "lm_head": "ColumnParallelLinear"},
                          # skip_weight_param_allocation: the head has no weight of its own (lm_head.weight is
                          # None), so the reference's tied lm_head.weight is embed_tokens.weight here too.
                          param_shards={"embed_tokens.weight": 0, "lm_head.bias": 0},
                          micro_records=dict(LOCAL_LOGITS), split="chunk")
        return Claims(module_types={"embed_tokens": "VocabParallelEmbedding", "proj": "Linear", "lm_head": "Linear"},
                      param_shards={"embed_tokens.weight": 0, "lm_head.bias": None, "lm_head.weight": None},
                      split="chunk")
