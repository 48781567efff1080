"""The one training loop every training subject runs on its ranks: it plays references/trajectory.py's
semantics with the ``Run`` a subject hands it and records what the checks read, in one order for every
subject (docs/subjects.md#adding-a-subject)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from parity.observe import collectives
from parity.observe.observations import RankObservations
from parity.subjects.plain_sgd import PlainSGD
from references.trajectory import TrainingSpec, step_num_items, trainer_objective


def attribute(root, path: str):
    """The module or tensor at a dotted path, None where the path leads nowhere."""
    for part in path.split("."):
        root = getattr(root, part, None)
    return root


# What a sharded layer says about its own partition and output, where it exposes it (DeepSpeed's AutoTP layers:
# gather_output, vocab range, TP size and index; Megatron's: gather_output, vocab range).
LAYER_FACTS = ("gather_output", "vocab_start_index", "vocab_end_index", "tp_world_size", "tp_index")


def record_structure(obs: RankObservations, model, claims, module_type=lambda m: type(m).__name__) -> None:
    """What the subject built, as its claims name it: each claimed module's class and partition facts, and
    whether each claimed tie is one Parameter (docs/subjects.md#structure-checks)."""
    obs.facts["module_types"] = {path: module_type(attribute(model, path)) for path in claims.module_types}
    modules = obs.facts.setdefault("structure", {}).setdefault("modules", {})
    for path in claims.module_types:
        module = attribute(model, path)
        found = {name: getattr(module, name) for name in LAYER_FACTS
                 if isinstance(getattr(module, name, None), (bool, int))}
        modules[path] = {"class": module_type(module), **found}
    obs.facts["shared_params"] = {f"{a}={b}": attribute(model, a) is attribute(model, b) is not None
                                  for a, b in claims.shared_params}


def param_structure(p) -> dict:
    """A parameter's local shape as this rank holds it, and a DTensor's placements
    (docs/subjects.md#structure-checks)."""
    placements = getattr(p, "placements", None)
    if placements is not None:
        return {"shape": tuple(p.to_local().shape), "placements": [str(x) for x in placements]}
    return {"shape": tuple(getattr(p, "ds_shape", p.shape))}


def record_params(run: "Run") -> None:
    """Before the first step, each parameter the update trains as this rank holds it
    (facts["structure"]["params"]); an update that names no parameters records none."""
    params = getattr(run.update, "params", None)
    if params is not None:
        run.obs.facts.setdefault("structure", {})["params"] = {name: param_structure(p) for name, p in params.items()}


def _same(tensor):
    return tensor


def _no_context(step: int, micro: int):
    return contextlib.nullcontext()


@dataclass
class Run:
    """One rank's training, as a subject hands it to ``train``."""
    obs: RankObservations
    train: TrainingSpec
    forward: Callable  # (batch, num_items) -> (loss, output)
    update: object  # PlainUpdate or an engine's: begin_step, backward, after_micro, end_step, finish, scale
    batches: Callable  # step -> (the rank's micro-batches on its device, the step's num_items)
    reduction: str = "mean"
    output_kind: str | None = "logits"  # the kind the forward's output is recorded as; None: not recorded
    steps: range | None = None  # the optimizer steps to run; None: all of train.steps
    # The head's input and its gradient ("x", "h"), filled by hooks the subject put on the model; None: no head.
    captured: dict | None = field(default_factory=dict)
    view: Callable = _same  # the tensor a rank records of one it holds (a DTensor's local shard)
    record_collectives: bool = False  # count the head's and loss's collectives per micro-batch
    micro_context: Callable = _no_context  # (step, micro) -> a context around one forward and backward
    after_forward: Callable | None = None  # (step, micro, loss, output), inside the micro-batch's context
    # The output and loss as the user holds them after the backward (Megatron's CE overwrites fp32 logits there:
    # ci/repro/megatron_ce_overwrites_fp32_logits.py), or as the forward returned them (the engine's records).
    outputs_after_backward: bool = True


def lm_batches(train: TrainingSpec, spec, dp_rank: int, device) -> Callable:
    """The LM's micro-batches of a step for this data-parallel rank, and the step's num_items."""
    def batches(step: int):
        made = [{k: t.to(device) for k, t in b.items()} for b in train.batches(step, dp_rank, spec.vocab,
                                                                              spec.ignore_index)]
        return made, step_num_items(train, step, spec.vocab, spec.ignore_index)
    return batches


def record_outputs(run: Run, step: int, micro: int, loss, output) -> None:
    if run.output_kind is not None:
        run.obs.record(run.output_kind, step, micro, None, run.view(output))
    run.obs.record("loss", step, micro, None, run.view(loss))


def train(run: Run) -> RankObservations:
    obs, update = run.obs, run.update
    record_params(run)
    update.start(run)
    for step in range(run.train.steps) if run.steps is None else run.steps:
        update.begin_step(step)
        batches, num_items = run.batches(step)
        for micro, batch in enumerate(batches):
            with contextlib.ExitStack() as stack:
                counts = stack.enter_context(collectives.recording()) if run.record_collectives else None
                stack.enter_context(run.micro_context(step, micro))
                loss, output = run.forward(batch, num_items)
                if run.after_forward is not None:
                    run.after_forward(step, micro, loss, output)
                if not run.outputs_after_backward:
                    record_outputs(run, step, micro, loss, output)
                update.backward(trainer_objective(loss, run.train, run.reduction))
            if counts is not None:
                obs.facts.setdefault("collectives", {})[(step, micro)] = dict(counts)
            if run.outputs_after_backward:
                record_outputs(run, step, micro, loss, output)
            if run.captured is not None:
                obs.record("head_input", step, micro, None, run.captured.pop("x"))
                obs.record("head_input_grad", step, micro, None, run.captured.pop("h"), unscale=update.scale)
            update.after_micro(step, micro)
        update.end_step(step)
    update.finish()
    return obs


class PlainUpdate:
    """Autograd accumulates the micro-batches in p.grad; then one plain-SGD step (parity/subjects/plain_sgd.py)."""
    scale = 1.0

    def __init__(self, model, params: dict, optimizer, grad_of=None, step_facts=None):
        self.model, self.params, self.optimizer = model, params, optimizer
        self.grad_of = grad_of or (lambda p: p.grad)  # the gradient the update applies, as autograd left it
        self.step_facts = step_facts  # (obs, step, params) -> None: what else a step records

    @classmethod
    def sgd(cls, model, dtype: torch.dtype, lr: float, **hooks) -> "PlainUpdate":
        params = dict(model.named_parameters())
        return cls(model, params, PlainSGD(params, dtype, lr), **hooks)

    def start(self, run: Run) -> None:
        self.obs, self.view = run.obs, run.view
        for name, p in self.params.items():
            self.obs.record("weight", -1, None, name, self.view(p))

    def begin_step(self, step: int) -> None:
        self.model.zero_grad(set_to_none=True)

    def backward(self, objective) -> None:
        objective.backward()

    def after_micro(self, step: int, micro: int) -> None:
        pass

    def end_step(self, step: int) -> None:
        grads = {name: (torch.zeros_like(p, dtype=torch.float32) if p.grad is None else self.grad_of(p).float())
                 for name, p in self.params.items()}
        if self.step_facts is not None:
            self.step_facts(self.obs, step, self.params)
        for name, g in grads.items():
            self.obs.record("grad", step, None, name, self.view(g))
        self.optimizer.step(grads)
        for name, m in self.optimizer.masters().items():
            self.obs.record("master_weight", step, None, name, self.view(m))
        for name, p in self.params.items():
            self.obs.record("weight", step, None, name, self.view(p))

    def finish(self) -> None:
        pass
