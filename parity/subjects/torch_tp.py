"""PyTorch's own tensor parallelism (``torch.distributed.tensor.parallel``, DTensor) on the tiny LM.

Plans follow torchtitan's Llama output layer and token embedding (models/llama3/infra/parallelize.py):
``output: ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1) if loss_parallel else
Replicate(), use_local_output=not loss_parallel)`` and ``tok_embeddings: RowwiseParallel(
input_layouts=Replicate(), output_layouts=Shard(1))``, its CE upcasting the logits to float32 first.
The tiny LM has no sequence-parallel norm, so the head's input and the embedding's output are
``Replicate()`` here where torchtitan has ``Shard(1)``.

- ``torch_column_gathered``: ColwiseParallel with Replicate output (an all-gather of the logits); the suite's CE.
- ``torch_vocab_parallel``: ColwiseParallel(use_local_output=False), Shard(-1) logits, and the CE
  ``F.cross_entropy`` under ``loss_parallel()`` (forward and backward inside it, as torch requires).
- ``torch_row_parallel``: RowwiseParallel(input_layouts=Replicate()): weight sharded along hidden,
  bias replicated, the Partial logits all-reduced; the suite's CE.
- ``torch_vocab_embedding``: RowwiseParallel on ``nn.Embedding`` (table sharded along the vocabulary,
  masked lookup, all-reduce); untied, the head stays a plain replicated Linear; tied, the head is
  ColwiseParallel with Replicate output and holds the embedding's Parameter.

Training is references/trajectory.py's, as in deepspeed_direct.py: micro-batch loss / accumulation
count, backward, then plain ``torch.optim.SGD`` in fp32 or a float32 master copy in bf16/fp16; the
optimizer runs on the DTensor parameters as a DTensor user's would. A rank records its local
shards (``to_local``), so the shard widths are checked against ``Claims.split = "chunk"``: DTensor's
Shard splits as torch.chunk does (parity/observe/partition.py), not as AutoTP does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from parity.observe import collectives
from parity.observe.dtypes import DTYPES
from parity.observe.observations import RankObservations
from parity.subjects.base import NAMED_HEADS, Claims, RankContext, Subject
from parity.subjects.plain_sgd import PlainSGD
from references.trajectory import step_num_items, trainer_objective
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


def _attribute(root, path: str):
    for part in path.split("."):
        root = getattr(root, part, None)
    return root


class TorchTPHead(Subject):
    """Shared loop: parallelize a fresh model with a plan, then train with plain SGD."""
    framework = "torch"

    axes = TORCH_AXES
    clean_state = CLEAN_STATE

    def records_master_weights(self, values: dict) -> bool:
        return PlainSGD.keeps_masters(DTYPES[values["dtype"]])

    def world_size(self, values):
        return values.get("tp", 1)

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
        if values.get("device") == "cuda" and self.all_gathers:
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
        claims = self.claims(values)

        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        obs.facts["module_types"] = {path: self.module_type(_attribute(model, path))
                                     for path in claims.module_types}
        obs.facts["shared_params"] = {f"{a}={b}": _attribute(model, a) is _attribute(model, b)
                                      for a, b in claims.shared_params}
        params = dict(model.named_parameters())
        for name, p in params.items():
            obs.record("weight", -1, None, name, _local(p))
        optimizer = PlainSGD(params, dtype, train.lr)
        for step in range(train.steps):
            model.zero_grad(set_to_none=True)
            batches = [{k: t.to(ctx.device) for k, t in b.items()}
                       for b in train.batches(step, dp_rank, spec.vocab, spec.ignore_index)]
            num_items = step_num_items(train, step, spec.vocab, spec.ignore_index)
            for micro, batch in enumerate(batches):
                with collectives.recording() as counts, self.loss_context():
                    loss, logits = self.forward(model, batch, num_items)
                    trainer_objective(loss, train, spec.reduction).backward()
                obs.facts.setdefault("collectives", {})[(step, micro)] = dict(counts)
                obs.record("logits", step, micro, None, _local(logits))
                obs.record("loss", step, micro, None, _local(loss))
                obs.record("head_input", step, micro, None, captured.pop("x"))
                obs.record("head_input_grad", step, micro, None, captured.pop("h"))
            grads = {name: (torch.zeros_like(p, dtype=torch.float32) if p.grad is None else _as_param(p.grad, p).float())
                     for name, p in params.items()}
            obs.facts.setdefault("grad_placements", {})[step] = {
                name: str(getattr(p.grad, "placements", None)) for name, p in params.items()}
            for name, g in grads.items():
                obs.record("grad", step, None, name, _local(g))
            optimizer.step(grads)
            for name, m in optimizer.masters().items():
                obs.record("master_weight", step, None, name, _local(m))
            for name, p in params.items():
                obs.record("weight", step, None, name, _local(p))
        return obs

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
        head = values["head"]
        return Claims(module_types={head: "Linear(Shard(dim=0),)", "proj": "Linear", "embed_tokens": "Embedding"},
                      param_shards={f"{head}.weight": 0, f"{head}.bias": 0}, split="chunk")


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
        head = values["head"]
        return Claims(module_types={head: "Linear(Shard(dim=0),)", "proj": "Linear", "embed_tokens": "Embedding"},
                      param_shards={f"{head}.weight": 0, f"{head}.bias": 0},
                      micro_records={"logits": -1, "loss": None, "head_input_grad": None}, split="chunk")


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
        head = values["head"]
        return Claims(module_types={head: "Linear(Shard(dim=1),)", "proj": "Linear", "embed_tokens": "Embedding"},
                      param_shards={f"{head}.weight": 1, f"{head}.bias": None}, split="chunk")


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
        return found if values.get("tied") else [r for r in found if not r.startswith("gpus")]

    def plan(self, values):
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import RowwiseParallel

        plan = {"embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        if values.get("tied"):
            plan[values["head"]] = _colwise()
        return plan

    def tie(self, model):
        if model.spec.tied:
            model.head.weight = model.embed_tokens.weight

    def claims(self, values):
        head = values["head"]
        tied = values.get("tied", False)
        return Claims(module_types={"embed_tokens": "Embedding(Shard(dim=0),)", "proj": "Linear",
                                    head: "Linear(Shard(dim=0),)" if tied else "Linear"},
                      param_shards={"embed_tokens.weight": 0, f"{head}.bias": 0 if tied else None},
                      shared_params=((f"{head}.weight", "embed_tokens.weight"),) if tied else (), split="chunk")
