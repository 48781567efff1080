"""Reference for loss-only subjects: cross entropy of given logits (or of a linear head's output),
and its gradients.

The upstream gradient is a fixed positive weight per token (not all ones) for reduction "none",
and a fixed scalar other than one for "sum"/"mean", so a subject that ignores grad_output, or
applies it to the wrong token, is caught. "mean" divides by the number of non-ignored targets,
as torch's F.cross_entropy does: an all-ignored batch gives 0/0 = nan (with a zero gradient).
"""
from __future__ import annotations

import contextlib

import torch

from references.loss import token_entropies, token_logprobs, token_losses
from references.seeding import exact_inputs
from references.trajectory import Trajectory

CE_REDUCTIONS = ("none", "sum", "mean")
BACKWARDS = ("once", "twice", "create_graph")
SCALAR_UPSTREAM = 0.75  # d(objective)/d(loss) for a scalar loss; exact in every dtype


def _targets_and_upstream(gen: torch.Generator, tokens: int, vocab: int, ignore: str, ignore_index: int):
    """Targets over the whole vocabulary (the last row always hit), optionally a quarter ignored, and a
    positive per-token upstream weight; drawn from ``gen`` after whatever the caller drew first."""
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    targets[0] = vocab - 1
    if ignore == "scattered":
        targets = targets.masked_fill(torch.rand(tokens, generator=gen) < 0.25, ignore_index)
        targets[1] = ignore_index
    upstream = torch.rand(tokens, generator=gen) + 0.5
    return targets, upstream


INF_ROWS = ("none", "all")


def ce_inputs(seed: int, tokens: int, vocab: int, ignore: str, dtype: torch.dtype, ignore_index: int = -100,
              inf_rows: str = "none"):
    """inf_rows "all": two rows whose logits are all -inf (a fully masked position): token 1 (its target ignored
    under scattered ignores) and the first later token whose target counts; the other values as drawn."""
    with exact_inputs():
        gen = torch.Generator().manual_seed(seed)
        logits = (3 * torch.randn(tokens, vocab, generator=gen)).to(dtype)
        targets, upstream = _targets_and_upstream(gen, tokens, vocab, ignore, ignore_index)
    if inf_rows not in INF_ROWS:
        raise ValueError(f"inf_rows must be one of {INF_ROWS}, got {inf_rows!r}")
    if inf_rows == "all":
        counted = next(i for i in range(2, tokens) if targets[i] != ignore_index)
        logits[[1, counted]] = float("-inf")
    return logits, targets, upstream


def topk_index(seed: int, targets: torch.Tensor, vocab: int, k: int, ignore_index: int = -100) -> torch.Tensor:
    """[tokens, k] ids whose log-probabilities a top-k caller asks for: the target first (ignored where it is),
    then k-1 ids drawn over the whole vocabulary, repeats allowed (a repeated id must count twice in the
    gradient); where the target is ignored at token 1 (ignore "scattered") the whole row is, whose gradient
    is then exactly 0. Drawn from its own generator, so the logits and targets stay those of ce_inputs."""
    with exact_inputs():
        gen = torch.Generator().manual_seed(seed + 2)
        others = torch.randint(0, vocab, (targets.shape[0], k - 1), generator=gen)
    index = torch.cat([targets.unsqueeze(-1), others], dim=-1)
    if targets.shape[0] > 1 and targets[1] == ignore_index:
        index[1] = ignore_index
    return index


def hvp_direction(seed: int, tokens: int, vocab: int) -> torch.Tensor:
    """The fixed direction v of the second-order check: d/dlogits sum(g * v), g the logits gradient."""
    with exact_inputs():
        gen = torch.Generator().manual_seed(seed + 1)
        return torch.randn(tokens, vocab, generator=gen)


def reduce_losses(losses: torch.Tensor, targets: torch.Tensor, reduction: str, ignore_index: int) -> torch.Tensor:
    """Per-token losses (0 at ignored targets) -> the loss a caller sees for ``reduction``."""
    if reduction not in CE_REDUCTIONS:
        raise ValueError(f"reduction must be one of {CE_REDUCTIONS}, got {reduction!r}")
    if reduction == "none":
        return losses
    total = losses.sum()
    if reduction == "sum":
        return total
    # torch's F.cross_entropy(reduction="mean"): nan (0/0) when every target is ignored, gradient zero.
    return total / (targets != ignore_index).sum().to(total.dtype)


def upstream_objective(loss: torch.Tensor, upstream: torch.Tensor, reduction: str) -> torch.Tensor:
    """The scalar that is backpropagated: per-token weights for "none", a fixed scalar otherwise. A per-token
    result with a trailing top-k dimension also weighs its k columns differently (1, 1.25, 1.5, ...: exact in
    every dtype), so a gradient given to the wrong one of a token's ids is caught."""
    if reduction == "none":
        weights = upstream.to(loss.dtype)
        if loss.dim() == upstream.dim() + 1:
            columns = 1 + 0.25 * torch.arange(loss.shape[-1], dtype=loss.dtype, device=loss.device)
            weights = weights.unsqueeze(-1) * columns
        return (loss * weights).sum()
    return loss * SCALAR_UPSTREAM


def sequence_chunk_sizes(tokens: int, parts: int, uneven: bool = False) -> list[int]:
    """Rows per sequence chunk: equal (an SP all-gather needs them), or uneven: the first chunk tokens // (4 parts)
    rows more than an equal one, the last as many fewer (24 tokens: 15/9 over 2, 10/8/6 over 3), as a sequence
    whose length the SP size does not divide, or a packed batch split at document boundaries, gives them."""
    if tokens % parts:
        raise ValueError(f"{tokens} tokens do not split into {parts} equal sequence chunks")
    sizes = [tokens // parts] * parts
    if uneven and parts > 1:
        shift = tokens // (4 * parts)
        sizes[0], sizes[-1] = sizes[0] + shift, sizes[-1] - shift
    return sizes


def sequence_chunk(tokens: int, parts: int, index: int, uneven: bool = False) -> slice:
    """The contiguous rows of sequence chunk ``index`` of ``parts`` (sequence_chunk_sizes)."""
    sizes = sequence_chunk_sizes(tokens, parts, uneven)
    start = sum(sizes[:index])
    return slice(start, start + sizes[index])


def _put_sequence_chunks(traj: Trajectory, records: dict, tokens: int, parts: int, whole: tuple,
                         uneven: bool = False) -> None:
    """Each record of the whole sequence, laid out per sequence chunk as the ranks hold it: chunk i's rows
    at data-parallel slot i (a rank's SP index), the kinds in ``whole`` (a scalar loss, a gathered per-token
    loss, a summed parameter gradient) whole at every slot. The numbers are the unsplit computation's."""
    for index in range(parts):
        rows = sequence_chunk(tokens, parts, index, uneven)
        for kind, tensor in records.items():
            traj.put(kind, 0, 0, index, None, tensor if kind in whole or tensor.dim() == 0 else tensor[rows])


def ce_reference(seed: int, tokens: int, vocab: int, ignore: str, case_dtype: torch.dtype,
                 compute_dtype: torch.dtype | None = None, ignore_index: int = -100,
                 reduction: str = "none", backward: str = "once", measure: str = "ce",
                 label_smoothing: float = 0.0, sequence_parts: int = 1, gathered: bool = False,
                 topk: int = 0, inf_rows: str = "none", uneven_chunks: bool = False) -> Trajectory:
    """backward: "once"; "twice" (two retained-graph backwards: the gradient accumulates to 2x);
    "create_graph" (the first-order gradient g with its graph, and logits_hvp = d/dlogits sum(g * v)).
    measure: "ce" (the cross entropy of the targets) or "entropy" (each token's softmax entropy, which
    takes no targets; reduction "none"). label_smoothing: torch's F.cross_entropy semantics
    (references/loss.py token_losses). topk k > 0 (measure "ce"): the loss is minus the log-probabilities of
    topk_index's k ids per token ([tokens, k]: -log_softmax(full).gather(-1, index)), reduction "none".
    inf_rows: ce_inputs' all -inf rows; torch's numbers there are nan (value and gradient), and so are these.

    sequence_parts: the records of the whole sequence (one loss over all its tokens, as a user without
    sequence parallelism computes it) split into that many chunks of rows (_put_sequence_chunks);
    gathered: the per-token loss stays whole (every chunk's rank holds the sequence's); uneven_chunks: the
    chunks of sequence_chunk_sizes(uneven=True)."""
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    if sequence_parts > 1 and backward != "once":
        raise ValueError(f"sequence_parts {sequence_parts} needs backward 'once', got {backward!r}")
    logits, targets, upstream = ce_inputs(seed, tokens, vocab, ignore, case_dtype, ignore_index, inf_rows)
    x = logits.to(compute_dtype or case_dtype).requires_grad_(True)
    if measure == "entropy":
        loss = token_entropies(x)
    elif topk:
        loss = -token_logprobs(x, topk_index(seed, targets, vocab, topk, ignore_index), ignore_index)
    else:
        loss = reduce_losses(token_losses(x, targets, ignore_index, label_smoothing), targets, reduction, ignore_index)
    objective = upstream_objective(loss, upstream, reduction)
    traj = Trajectory()
    if backward == "create_graph":
        (grad,) = torch.autograd.grad(objective, x, create_graph=True)
        v = hvp_direction(seed, tokens, vocab).to(grad.dtype)
        (hvp,) = torch.autograd.grad((grad * v).sum(), x)
    else:
        objective.backward(retain_graph=backward == "twice")
        if backward == "twice":
            objective.backward()
        grad = x.grad
    traj.floor_dtypes["loss"] = loss.dtype  # float32 (token_losses upcasts) from the exact input logits
    records = {"loss": loss, "logits_grad": grad, "logits_after": logits}  # logits_after: the input as given
    if backward == "create_graph":
        records["logits_hvp"] = hvp
    _put_sequence_chunks(traj, records, tokens, sequence_parts, whole=("loss",) if gathered else (),
                         uneven=uneven_chunks)
    return traj


def linear_ce_inputs(seed: int, tokens: int, vocab: int, hidden: int, bias: bool, ignore: str, dtype: torch.dtype,
                     ignore_index: int = -100):
    """hidden [N, H], the full head weight [V, H], its bias [V] (or None), targets [N], upstream [N].

    Drawn in float32 and cast to ``dtype`` once, so the float64 oracle starts from the same values."""
    with exact_inputs():
        gen = torch.Generator().manual_seed(seed)
        h = torch.randn(tokens, hidden, generator=gen).to(dtype)
        w = (2.0 / hidden ** 0.5 * torch.randn(vocab, hidden, generator=gen)).to(dtype)
        b = (0.5 * torch.randn(vocab, generator=gen)).to(dtype)
        targets, upstream = _targets_and_upstream(gen, tokens, vocab, ignore, ignore_index)
    return h, w, (b if bias else None), targets, upstream


def linear_ce_reference(seed: int, tokens: int, vocab: int, hidden: int, bias: bool, ignore: str,
                        case_dtype: torch.dtype, compute_dtype: torch.dtype | None = None, ignore_index: int = -100,
                        reduction: str = "mean", sequence_parts: int = 1,
                        autocast: torch.dtype | None = None) -> Trajectory:
    """CE of ``hidden @ weight.T + bias``: the product at the compute dtype (rounded there, like an
    unfused head), then the softmax in float32 (float64 for the oracle). sequence_parts: per-token records
    split into chunks of rows as in ce_reference; the head's gradients whole (the full sequence's).
    ``autocast``: the user's AMP forward, linear and CE under ``torch.autocast("cpu", dtype=autocast)`` on
    the (float32) inputs, backward outside it: the product in the autocast dtype, its gradients computed
    there and returned in float32. The float64 oracle takes no autocast."""
    h, w, b, targets, upstream = linear_ce_inputs(seed, tokens, vocab, hidden, bias, ignore, case_dtype,
                                                  ignore_index)
    dtype = compute_dtype or case_dtype
    if dtype == torch.float64:
        autocast = None
    x = h.to(dtype).requires_grad_(True)
    weight = w.to(dtype).requires_grad_(True)
    b_ = None if b is None else b.to(dtype).requires_grad_(True)
    with (torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()):
        logits = x @ weight.t() if b_ is None else torch.addmm(b_, x, weight.t())
        loss = reduce_losses(token_losses(logits, targets, ignore_index), targets, reduction, ignore_index)
    upstream_objective(loss, upstream, reduction).backward()
    traj = Trajectory()
    if autocast is not None:
        # Float32 values every one of which came out of a GEMM in the autocast dtype: that is their floor.
        traj.floor_dtypes.update(dict.fromkeys(("hidden_grad", "weight_grad", "bias_grad"), autocast))
    # The loss is float32 (token_losses upcasts). Its one low-precision step is the logits' rounding,
    # each logit a dot product over the hidden size rounded once, wherever a run splits the vocabulary
    # or chunks the tokens: an independent per-element error that the reference's own error (and, on a
    # miss, the rounding samples) measures, not a summation-order effect. What another order changes
    # (the softmax over vocabulary shards, the sum over tokens) is float32, so that is the floor's dtype.
    # With the case dtype's floor (16 bf16 units of the loss) a bf16 mean/sum loss hid a 6% scale.
    traj.floor_dtypes["loss"] = loss.dtype
    records = {"loss": loss, "hidden_grad": x.grad, "weight_grad": weight.grad}
    if b_ is not None:
        records["bias_grad"] = b_.grad
    _put_sequence_chunks(traj, records, tokens, sequence_parts, whole=("weight_grad", "bias_grad"))
    return traj
