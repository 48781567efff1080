"""Reference for an embedding table trained on its own: lookup + a squared-error loss. Plain torch.

The subject that shards the table (a vocabulary-parallel embedding built directly) is compared with
this, step by step, like the heads are with the tiny LM. Semantics:
- each micro-batch's input ids come from references/data.py (the same stream the heads see);
- the loss of a micro-batch is sum((E[ids] - T)^2) over every element (a sum, so that one bf16
  update moves the table by more than half an ulp), computed in float32 (float64
  for the oracle), T a fixed target drawn from (seed, step, micro) in [-1, 1); it is divided by the
  accumulation count before backward;
- plain SGD, through float32 master weights when the table is bf16/fp16 (references/sgd.py);
- scaled: the lookup times embed_scale, as transformers' Gemma3TextScaledWordEmbedding does it (scaled_lookup).
"""
from __future__ import annotations

import torch
from torch import nn

from references.data import make_batch
from references.seeding import exact_inputs, seeded
from references.sgd import SGD
from references.trajectory import TrainingSpec, Trajectory


def build_embedding(vocab: int, hidden: int, padding_idx: int | None, seed: int, dtype: torch.dtype) -> nn.Embedding:
    """Initial table depends only on its arguments: drawn in fp32, then cast, the cast an exact input
    too (references.tiny_lm.build_model says why)."""
    with seeded(seed):
        return nn.Embedding(vocab, hidden, padding_idx=padding_idx).to(dtype)


def embed_scale(hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Gemma3's embed_scale as its model holds it: sqrt(hidden) made a float32 buffer, cast with the model to
    ``dtype`` (modeling_gemma3.py: nn.Buffer(torch.tensor(hidden_size ** 0.5)), model.to(dtype) casts buffers).
    Part of the model, so the float64 oracle uses the same value."""
    return torch.tensor(hidden ** 0.5, dtype=torch.float32).to(dtype)


def scaled_lookup(table: nn.Embedding, ids: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """HF's forward, written out: the lookup times the scale cast to the weight dtype (so a bf16 model multiplies
    by bf16(sqrt(hidden)) and rounds the product to bf16)."""
    out = table(ids)
    return out if scale is None else out * scale.to(table.weight.dtype)


def lookup_batch(train: TrainingSpec, step: int, micro: int, vocab: int, hidden: int) -> tuple:
    ids = make_batch(train.seed, step, micro, 0, batch=train.batch, seq=train.seq, vocab=vocab,
                     ignore="none", pad_token=train.pad_token)["input_ids"]
    with exact_inputs():
        gen = torch.Generator().manual_seed((train.seed * 7919 + step * 131 + micro) % (2**31))
        target = torch.rand((train.batch, train.seq, hidden), generator=gen, dtype=torch.float64) * 2 - 1
    return ids, target


def lookup_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    compute = torch.float64 if out.dtype == torch.float64 else torch.float32
    return ((out.to(compute) - target.to(compute)) ** 2).sum()


def train_lookup_reference(vocab: int, hidden: int, padding_idx: int | None, train: TrainingSpec,
                           case_dtype: torch.dtype, compute_dtype: torch.dtype | None = None,
                           scaled: bool = False) -> Trajectory:
    dtype = compute_dtype or case_dtype
    table = build_embedding(vocab, hidden, padding_idx, train.seed, case_dtype).to(dtype)
    scale = embed_scale(hidden, case_dtype).to(dtype) if scaled else None
    low_precision = dtype in (torch.bfloat16, torch.float16)
    params = {"weight": table.weight}
    optimizer = SGD(params, train.lr, torch.float32 if low_precision else None)
    traj = Trajectory()
    traj.put("weight", -1, None, None, "weight", table.weight)
    for step in range(train.steps):
        table.zero_grad(set_to_none=True)
        for micro in range(train.micro_batches):
            ids, target = lookup_batch(train, step, micro, vocab, hidden)
            out = scaled_lookup(table, ids, scale)
            loss = lookup_loss(out, target)
            (loss / train.micro_batches).backward()
            traj.put("embedding", step, micro, 0, None, out)
            traj.put("loss", step, micro, 0, None, loss)
        grad = table.weight.grad.to(torch.float64 if dtype == torch.float64 else torch.float32)
        traj.put("grad", step, None, None, "weight", grad)
        optimizer.step({"weight": grad})
        traj.put("weight", step, None, None, "weight", table.weight)
    return traj
