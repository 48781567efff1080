"""DeepSpeed 0.19.8 AutoTP output heads built directly (no engine), so that a failure can be
localised to the layer or to the engine around it.

Each subject deep-copies the tiny LM (references/tiny_lm.py), turns on AutoTP training mode
(``set_autotp_mode(training=True)``, else the layer's parameters come out with requires_grad=False),
installs the TP group the way the engine subjects do (``deepspeed.utils.groups``, one set per TP
size, ``install_tp_groups``) and wraps the copy's head in the layer the engine would build:

- ``direct_column_gathered``: ``LinearLayer(head, group, gather_output=True)``; full-vocabulary
  logits, the suite's CE on top (every reduction).
- ``direct_vocab_parallel``: ``VocabParallelLinear(head, group)`` + DeepSpeed's
  ``VocabParallelCausalLMLoss`` (backend torch, the layer's own vocab bounds) installed as
  ``model.loss_function``, as ``configure_vocab_parallel_loss`` does; rank-local logits.
- ``direct_row_parallel``: ``LinearAllreduceWithReplicatedInput(head, group)``; weight sharded along
  hidden, bias replicated, full logits after the all-reduce, the suite's CE on top.

Training follows references/trajectory.py exactly, with no engine: each micro-batch loss is scaled
as the HF Trainer does (trajectory.trainer_objective: 1/GAS, or x dp for num_items); the step
gradient is what autograd accumulated in ``p.grad`` (in the parameter's dtype); plain
``torch.optim.SGD`` in fp32; in bf16 a float32 master copy per parameter, ``master -= lr * grad``
then cast back (references/sgd.py, as DeepSpeed's bf16 optimizer does). Records are the engine
subjects' (logits, loss, head_input_grad, grad, weight), so parity/checks/compare.py judges both alike.
"""
from __future__ import annotations


import torch

from parity.observe.observations import RankObservations
from parity.subjects.base import NAMED_HEADS, Claims, RankContext, Subject
from parity.subjects.plain_sgd import PlainSGD
from parity.subjects.deepspeed_autotp import (CLEAN_STATE, _attribute, install_tp_groups, record_loss_backend,
                                              reset_deepspeed_state, setup_deepspeed)
from parity.observe.dtypes import DTYPES
from references.tiny_lm import build_model, capture_head_input_and_grad
from references.trajectory import step_num_items, trainer_objective

DIRECT_AXES = {"dtype": ("fp32", "bf16"), "reduction": None, "vocab": None, "hidden": None, "bias": None,
               "head": NAMED_HEADS, "ignore": None, "gas": None, "tp": None, "device": None}


class DirectHead(Subject):
    """Shared loop: build the layer around a copy of the head, then train with plain SGD."""
    framework = "deepspeed"

    axes = DIRECT_AXES
    clean_state = CLEAN_STATE
    layer_class = ""

    def records_master_weights(self, values: dict) -> bool:
        return PlainSGD.keeps_masters(DTYPES[values["dtype"]])

    def world_size(self, values):
        return values.get("tp", 1)

    def reset_process_state(self, ctx: RankContext) -> dict:
        setup_deepspeed(ctx)
        return reset_deepspeed_state()

    def build_head(self, head, group, values):
        raise NotImplementedError

    def install_loss(self, model, layer, group) -> bool:
        """Returns whether DeepSpeed's CE is the loss (then the backend that ran is recorded)."""
        return False

    def run_rank(self, values: dict, ctx: RankContext) -> RankObservations:
        from deepspeed.module_inject.layers import set_autotp_mode
        from deepspeed.utils import groups

        setup_deepspeed(ctx)
        tp = values["tp"]
        install_tp_groups(ctx, tp)
        tp_rank, dp_rank = ctx.tp_dp(tp)
        spec, train = self.model_spec(values), self.training_spec(values)
        dtype = DTYPES[values["dtype"]]
        model = build_model(spec, train.seed, dtype).to(ctx.device)  # a fresh model per case: nothing to copy
        set_autotp_mode(training=True)
        group = groups.get_tensor_model_parallel_group()
        layer = self.build_head(model.head, group, values)
        model.replace_head(layer)
        ds_loss = self.install_loss(model, layer, group)

        obs = RankObservations(ctx.rank, tp_rank, dp_rank)
        obs.facts["module_types"] = {path: type(_attribute(model, path)).__name__
                                     for path in self.claims(values).module_types}
        params = dict(model.named_parameters())
        for name, p in params.items():
            obs.record("weight", -1, None, name, p)
        optimizer = PlainSGD(params, dtype, train.lr)
        captured: dict = {}
        capture_head_input_and_grad(model, captured)
        backend_log: list = []
        backends = {}
        with record_loss_backend(backend_log):
            for step in range(train.steps):
                model.zero_grad(set_to_none=True)
                batches = [{k: t.to(ctx.device) for k, t in b.items()}
                           for b in train.batches(step, dp_rank, spec.vocab, spec.ignore_index)]
                num_items = step_num_items(train, step, spec.vocab, spec.ignore_index)
                for micro, batch in enumerate(batches):
                    before = len(backend_log)
                    loss, logits = model(**batch, num_items_in_batch=num_items)
                    backends[(step, micro)] = backend_log[before:]
                    trainer_objective(loss, train, spec.reduction).backward()
                    obs.record("logits", step, micro, None, logits)
                    obs.record("loss", step, micro, None, loss)
                    obs.record("head_input", step, micro, None, captured.pop("x"))
                    obs.record("head_input_grad", step, micro, None, captured.pop("h"))
                grads = {name: (torch.zeros_like(p, dtype=torch.float32) if p.grad is None else p.grad.float())
                         for name, p in params.items()}
                for name, g in grads.items():
                    obs.record("grad", step, None, name, g)
                optimizer.step(grads)
                for name, m in optimizer.masters().items():
                    obs.record("master_weight", step, None, name, m)
                for name, p in params.items():
                    obs.record("weight", step, None, name, p)
        if ds_loss:
            obs.facts["loss_backend"] = backends
        return obs


class DirectColumnGatheredHead(DirectHead):
    name = "direct_column_gathered"
    feature = "column head (gathered logits)"
    description = ("LinearLayer(gather_output=True) built directly around the head (no engine): column-parallel "
                   "weight and bias, full-vocabulary logits, the suite's CE on top; plain SGD.")

    def build_head(self, head, group, values):
        from deepspeed.module_inject.layers import LinearLayer

        return LinearLayer(head, group, gather_output=True, name=values["head"])

    def claims(self, values):
        head = values["head"]
        return Claims(module_types={head: "LinearLayer", "proj": "Linear", "embed_tokens": "Embedding"},
                      param_shards={f"{head}.weight": 0, f"{head}.bias": 0})


class DirectVocabParallelHead(DirectHead):
    name = "direct_vocab_parallel"
    feature = "vocab-parallel head + CE"
    description = ("VocabParallelLinear + VocabParallelCausalLMLoss (torch backend) built directly (no engine): "
                   "rank-local logits, the distributed CE as model.loss_function; plain SGD.")
    # VocabParallelCausalLMLoss reduces to mean, or to sum / num_items_in_batch when given one.
    axes = {**DIRECT_AXES, "reduction": ("mean", "num_items")}

    def build_head(self, head, group, values):
        from deepspeed.module_inject.layers import VocabParallelLinear

        return VocabParallelLinear(head, group, name=values["head"])

    def install_loss(self, model, layer, group):
        from deepspeed.sequence.cross_entropy import VocabParallelCausalLMLoss

        model.loss_function = VocabParallelCausalLMLoss(tp_group=layer.mp_group,
                                                        vocab_start_index=layer.vocab_start_index,
                                                        vocab_end_index=layer.vocab_end_index,
                                                        ignore_index=model.spec.ignore_index, backend="torch")
        return True

    def claims(self, values):
        head = values["head"]
        return Claims(module_types={head: "VocabParallelLinear", "proj": "Linear", "embed_tokens": "Embedding",
                                    "loss_function": "VocabParallelCausalLMLoss"},
                      param_shards={f"{head}.weight": 0, f"{head}.bias": 0},
                      micro_records={"logits": -1, "loss": None, "head_input_grad": None},
                      loss_backend="torch")


class DirectRowParallelHead(DirectHead):
    name = "direct_row_parallel"
    feature = "row head"
    description = ("LinearAllreduceWithReplicatedInput built directly around the head (no engine): weight sharded "
                   "along hidden, bias replicated, full logits after the all-reduce, the suite's CE; plain SGD.")

    def build_head(self, head, group, values):
        from deepspeed.module_inject.layers import LinearAllreduceWithReplicatedInput

        return LinearAllreduceWithReplicatedInput(head, group, name=values["head"])

    def claims(self, values):
        head = values["head"]
        return Claims(module_types={head: "LinearAllreduceWithReplicatedInput", "proj": "Linear",
                                    "embed_tokens": "Embedding"},
                      param_shards={f"{head}.weight": 1, f"{head}.bias": None})
