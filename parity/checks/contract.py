"""Precision and placement are part of the contract: every tensor a subject hands back must have
the dtype the unsharded plain-torch reference holds at the same point, and live on the rank's device.

The numbers alone cannot see this: a subject that hands back float32 logits in a bf16 case may be
closer to the oracle than the reference, and passes every bound; a user who swaps it in gets twice
the memory and a different optimizer input. So for each rank and each record kind (logits, loss,
grad, weight, ...) one ``contract[<kind>]`` check compares, at every step and micro-batch:

- dtype: against ``Trajectory.layouts``, the dtype of the reference's own tensor at that point
  (recorded by references/ before the float64 copy). What that is, and where it comes from:
  - logits, head_input (the hidden state the head receives), head_input_grad, embedding,
    logits_grad/_hvp/_after, hidden/weight/bias_grad: the model (case) dtype: nn.Linear/nn.Embedding
    output at their parameters' dtype, and autograd gives a tensor's gradient that tensor's dtype.
  - loss: float32 in bf16/fp16 cases: the reference upcasts logits before the softmax
    (references/loss.py), as HF's ``ForCausalLMLoss`` does (transformers 5.24,
    loss/loss_utils.py: ``logits = logits.float()``) and DeepSpeed's vocabulary-parallel CE does.
  - weight: the model dtype: the parameter the model holds (a bf16 model keeps bf16 weights; the
    float32 master lives in the optimizer).
  - grad: the gradient the update uses, float32 in bf16/fp16 cases: the reference accumulates in
    p.grad and hands the SGD step a float32 copy (references/trajectory.py; references/sgd.py
    applies it to the float32 master), as DeepSpeed's bf16/fp16 optimizers apply an fp32
    gradient to their fp32 master.
  - grad_norm: float64 on both sides (the reference computes the norm in double; the engine
    subjects wrap DeepSpeed's Python float in a float64 tensor), so only its device is telling.
- device: the device the rank runs on (``facts["rank_device"]``, set by the rank worker).

An empty tensor's dtype is not held (it changes no number); its device is.

Shapes are held by the numerical checks already (close/exact fail "shape ... != expected" per
rank, against the suite's own partition of the reference), so they are not repeated here.
"""
from __future__ import annotations

from parity.observe.records import MICRO, record_kind


def _reference_key(kind, step, micro, name, dp_rank):
    # Per-micro-batch records (the schema's ``per``) are the reference's at this data-parallel rank; the
    # rest (weights, gradients, the norm) are the one unsharded tensor every rank holds a view of.
    if record_kind(kind).per == MICRO or micro is not None:
        return (kind, step, micro, dp_rank, None)
    return (kind, step, None, None, name)


def contract_checks(observations: dict, reference) -> list[dict]:
    """One dict per rank and record kind: name, passed, rank, detail (compare.py makes Checks of them)."""
    layouts = getattr(reference, "layouts", {})
    checks = []
    for rank, o in sorted(observations.items()):
        want_device = o.facts.get("rank_device")
        by_kind: dict = {}
        for key in sorted(o.tensors, key=repr):
            kind, step, micro, name = key
            where = f"{kind}[{name}]" if name else kind
            problems = by_kind.setdefault(kind, [])
            ref = layouts.get(_reference_key(kind, step, micro, name, o.dp_rank))
            if ref is None:
                problems.append(f"{where} step {step} micro {micro}: the reference holds no tensor here")
                continue
            got_dtype, got_device = o.dtypes.get(key), getattr(o, "devices", {}).get(key)
            # An empty shard (hidden 2 over tp 2 with grain 2) holds no value a dtype could change, and
            # DeepSpeed's optimizers map no float32 state to it: safe_get_full_grad hands back its bf16
            # p.grad as is (parity explore --seed 9). Its placement still counts.
            empty = getattr(o.tensors.get(key), "size", 1) == 0
            if got_dtype != ref[0] and not empty:
                problems.append(f"{where} step {step} micro {micro}: dtype {got_dtype}, reference {ref[0]}")
            if want_device is not None and got_device != want_device:
                problems.append(f"{where} step {step} micro {micro}: on {got_device}, rank runs on {want_device}")
        for kind, problems in by_kind.items():
            detail = ("dtype and device as the reference's" if not problems else
                      f"{len(problems)} mismatches; first: {problems[0]}")
            checks.append({"name": f"contract[{kind}]", "passed": not problems, "rank": rank, "detail": detail})
    return checks
