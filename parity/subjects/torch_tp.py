"""PyTorch's own tensor parallelism (``torch.distributed.tensor.parallel``, DTensor) on the tiny LM, with plans
after torchtitan's Llama output layer and token embedding, trained by the driver (docs/subjects.md#pytorch-dtensor)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from parity.observe.dtypes import DTYPES
from parity.observe.observations import RankObservations
import parity.subjects.driver as driver  # the module, not the package: no import cycle
from parity.subjects.base import LOCAL_LOGITS, NAMED_HEADS, Claims, RankContext, Subject, head_claims
from parity.subjects.driver import record_structure
from parity.subjects.plain_sgd import PlainSGDHead
from references.tiny_lm import build_model, capture_head_input_and_grad

TORCH_AXES = {"dtype": ("fp32", "bf16", "fp16"), "reduction": None, "vocab": None, "hidden": None, "bias": None,
              "head": NAMED_HEADS, "ignore": None, "gas": None, "tp": None, "device": None}
CLEAN_STATE = {"loss_parallel_handlers": []}


def _loss_parallel_handlers() -> list[str]:
    """The ops loss_parallel() reroutes while it is active; a case that died inside it leaves them."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel.loss import customized_loss_ops

    installed = DTensor._op_dispatcher._custom_op_handlers
    return sorted(str(op) for op in customized_loss_ops if op in installed)


def tp_mesh(ctx: RankContext, tp: int):
    """A 1-D mesh over the rank group the worker made; one per TP size and process (a mesh over a
    subset would build a new gloo group each time)."""
    from torch.distributed.device_mesh import DeviceMesh

    if ctx.world_size != tp:
        raise ValueError(f"torch_tp subjects run with world size == tp; got world {ctx.world_size}, tp {tp}")
    meshes = ctx.state.setdefault("torch_tp_meshes", {})
    if tp not in meshes:
        meshes[tp] = DeviceMesh(torch.device(ctx.device).type, list(range(tp)))
    return meshes[tp]


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _as_param(grad, param):
    """The gradient as the update applies it: DTensor may hold a gradient in another placement than
    its parameter's (SGD's add_ then redistributes it), so record it where the parameter lives."""
    placements = getattr(param, "placements", None)
    if placements is None or getattr(grad, "placements", placements) == placements:
        return grad
    return grad.redistribute(param.device_mesh, placements)


def _grad_placements(obs, step: int, params: dict) -> None:
    """Where each gradient lives as the step applies it (a DTensor's placements)."""
    obs.facts.setdefault("grad_placements", {})[step] = {name: str(getattr(p.grad, "placements", None))
                                                         for name, p in params.items()}


class TorchTPHead(PlainSGDHead, Subject):
    """Parallelizes a fresh model with a plan; the driver trains it with plain SGD."""
    framework = "torch"

    axes = TORCH_AXES
    clean_state = CLEAN_STATE

    def reset_process_state(self, ctx: RankContext) -> dict:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.parallel.loss import customized_loss_ops

        for op in customized_loss_ops:
            DTensor._op_dispatcher._custom_op_handlers.pop(op, None)
        return {"loss_parallel_handlers": _loss_parallel_handlers()}

    def plan(self, values) -> dict:
        raise NotImplementedError

    # The plan redistributes Shard -> Replicate with an all-gather somewhere (forward or backward).
    all_gathers = True

    def requires(self, values):
        found = super().requires(values)
        if values["device"] == "cuda" and self.all_gathers:
            found.append(f"gpus{self.world_size(values)}")
        return found

    def tie(self, model) -> None:
        """parallelize_module wraps each module's DTensor in a Parameter of its own: re-share it."""

    def forward(self, model, batch, num_items):
        """(loss, logits); by default the model's own loss, the suite's CE on full logits."""
        return model(**batch, num_items_in_batch=num_items)

    def loss_context(self):
        import contextlib

        return contextlib.nullcontext()

    def run_rank(self, values: dict, ctx: RankContext) -> RankObservations:
        from torch.distributed.tensor.parallel import parallelize_module

        tp = values["tp"]
        mesh = tp_mesh(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        model = build_model(spec, train.seed, dtype).to(ctx.device)
        captured: dict = {}
        # Before parallelizing: the hook then sees the plain hidden state, ahead of the plan's input hook.
        capture_head_input_and_grad(model, captured)
        parallelize_module(model, mesh, self.plan(values))
        self.tie(model)
        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        record_structure(obs, model, self.claims(values), self.module_type)
        update = driver.PlainUpdate.sgd(model, dtype, train.lr, grad_of=lambda p: _as_param(p.grad, p),
                                        step_facts=_grad_placements)
        return driver.train(driver.Run(obs, train, lambda batch, n: self.forward(model, batch, n), update,
                                       driver.lm_batches(train, spec, dp_rank, ctx.device), spec.reduction,
                                       captured=captured, view=_local, record_collectives=True,
                                       micro_context=lambda step, micro: self.loss_context()))

    @staticmethod
    def module_type(module) -> str:
        """The class, and for a parallelized module the placement of its weight: a plan that left
        the head replicated still has an nn.Linear, so the class alone would not tell."""
        from torch.distributed.tensor import DTensor

        weight = getattr(module, "weight", None)
        if isinstance(weight, DTensor):
            return f"{type(module).__name__}{tuple(weight.placements)}"
        return type(module).__name__


def _colwise(output_layouts=None, use_local_output=True):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel(input_layouts=Replicate(), output_layouts=output_layouts or Replicate(),
                           use_local_output=use_local_output)


class TorchColumnGatheredHead(TorchTPHead):
    name = "torch_column_gathered"
    feature = "column head (gathered logits)"
    description = ("ColwiseParallel head (torchtitan's output plan without loss_parallel): Shard(0) weight and "
                   "bias, logits all-gathered to Replicate, the suite's CE; plain SGD on DTensor parameters.")

    def plan(self, values):
        return {values["head"]: _colwise()}

    def claims(self, values):
        return head_claims(values["head"], "Linear(Shard(dim=0),)", 0, split="chunk")


class TorchVocabParallelHead(TorchTPHead):
    name = "torch_vocab_parallel"
    feature = "vocab-parallel head + CE"
    description = ("ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) + F.cross_entropy under "
                   "loss_parallel() (torch's vocab-parallel CE, logits upcast to fp32 as torchtitan does).")

    all_gathers = False  # loss_parallel keeps the logits sharded: all-reduces only

    def plan(self, values):
        from torch.distributed.tensor import Shard

        return {values["head"]: _colwise(Shard(-1), use_local_output=False)}

    def loss_context(self):
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def forward(self, model, batch, num_items):
        _, logits = model(batch["input_ids"])
        return self.loss(model, logits, batch, num_items), logits

    def loss(self, model, logits, batch, num_items):
        # HF's causal shift done on the labels (pad, then drop the first), so the sharded logits are not sliced.
        spec = model.spec
        labels = F.pad(batch["labels"], (0, 1), value=spec.ignore_index)[..., 1:]
        flat = logits.flatten(0, 1).float()
        reduction = {"num_items": "sum"}.get(spec.reduction, spec.reduction)
        loss = F.cross_entropy(flat, labels.flatten(), reduction=reduction, ignore_index=spec.ignore_index)
        if spec.reduction == "none":
            return loss.view(labels.shape)[..., :-1]
        if spec.reduction == "num_items":
            return loss / int(num_items)  # as transformers' fixed_cross_entropy: unguarded, 0/0 = nan
        return loss

    def claims(self, values):
        return head_claims(values["head"], "Linear(Shard(dim=0),)", 0, micro_records=dict(LOCAL_LOGITS), split="chunk")


class TorchRowParallelHead(TorchTPHead):
    name = "torch_row_parallel"
    feature = "row head"
    description = ("RowwiseParallel(input_layouts=Replicate()) head: Shard(1) weight, replicated bias, Partial "
                   "logits all-reduced to Replicate, the suite's CE; plain SGD on DTensor parameters.")

    def plan(self, values):
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import RowwiseParallel

        return {values["head"]: RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}

    def claims(self, values):
        return head_claims(values["head"], "Linear(Shard(dim=1),)", 1, None, split="chunk")


class TorchVocabParallelEmbedding(TorchTPHead):
    name = "torch_vocab_embedding"
    feature = "vocab-parallel embedding"
    description = ("RowwiseParallel on nn.Embedding (torchtitan's tok_embeddings plan, Replicate output): table "
                   "sharded along vocab, masked lookup + all-reduce. Untied: plain head; tied: ColwiseParallel "
                   "head sharing the embedding's Parameter.")
    axes = {**TORCH_AXES, "tied": None}

    def requires(self, values):
        # Untied, the lookup's Partial -> Replicate is an all-reduce; tied, the head all-gathers its logits.
        found = super().requires(values)
        return found if values["tied"] else [r for r in found if not r.startswith("gpus")]

    def plan(self, values):
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import RowwiseParallel

        plan = {"embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        if values["tied"]:
            plan[values["head"]] = _colwise()
        return plan

    def tie(self, model):
        if model.spec.tied:
            model.head.weight = model.embed_tokens.weight

    def claims(self, values):
        head = values["head"]
        tied = values["tied"]
        return Claims(module_types={"embed_tokens": "Embedding(Shard(dim=0),)", "proj": "Linear",
                                    head: "Linear(Shard(dim=0),)" if tied else "Linear"},
                      param_shards={"embed_tokens.weight": 0, f"{head}.bias": 0 if tied else None},
                      shared_params=((f"{head}.weight", "embed_tokens.weight"),) if tied else (), split="chunk")
