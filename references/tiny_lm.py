"""A tiny causal LM whose output head is the thing being sharded.

embed_tokens -> proj -> tanh -> head, where head is named ``lm_head`` or ``embed_out`` (the two
names DeepSpeed's head detection looks for) and may share its weight with the embedding.
The same class is the unsharded reference and, deep-copied, the model handed to a subject:
it plays the part of the user's model, not of the code under test.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from references.loss import causal_lm_loss
from references.seeding import seeded


@dataclass(frozen=True)
class ModelSpec:
    vocab: int
    hidden: int
    bias: bool = True
    head_name: str = "lm_head"
    tied: bool = False
    reduction: str = "mean"
    ignore_index: int = -100
    head_input: str = "sequence"  # "flat": the head sees [B*T, H] and its logits are reshaped to [B, T, V]
    # nn.Embedding(padding_idx=...): that row starts at zero and its lookups pass no gradient back
    # (a tied head's projection still does). None: no padding row.
    padding_idx: int | None = None
    label_smoothing: float = 0.0  # the CE's, with torch's F.cross_entropy semantics (references/loss.py)


class TinyCausalLM(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden, padding_idx=spec.padding_idx)
        self.proj = nn.Linear(spec.hidden, spec.hidden, bias=spec.bias)
        self.replace_head(nn.Linear(spec.hidden, spec.vocab, bias=spec.bias))
        if spec.tied:
            self.head.weight = self.embed_tokens.weight
        # HF-style hook: a vocabulary-parallel subject replaces it with its distributed loss.
        self.loss_function = None

    @property
    def head(self) -> nn.Module:
        module = self
        for part in self.spec.head_name.split("."):
            module = getattr(module, part)
        return module

    def replace_head(self, head: nn.Module) -> None:
        """Put ``head`` at spec.head_name; a dotted name ("model.lm_head") nests it in plain containers."""
        *parents, leaf = self.spec.head_name.split(".")
        owner = self
        for part in parents:
            if not hasattr(owner, part):
                setattr(owner, part, nn.Module())
            owner = getattr(owner, part)
        setattr(owner, leaf, head)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(self.embed_tokens(input_ids)))

    def forward(self, input_ids, labels=None, num_items_in_batch=None):
        h = self.hidden_states(input_ids)
        if self.spec.head_input == "flat":
            logits = self.head(h.reshape(-1, h.shape[-1])).view(*h.shape[:-1], -1)
        else:
            logits = self.head(h)
        if labels is None:
            return None, logits
        if self.spec.reduction != "num_items":
            num_items_in_batch = None  # as HF: only a trainer that counts tokens passes it
        if self.loss_function is not None:
            # A model whose labels use another ignore id hands it to its loss, as an HF model forwards the
            # caller's loss kwargs (transformers' ForCausalLMLoss honours ignore_index); the default is not
            # passed, as HF callers don't.
            extra = {} if self.spec.ignore_index == -100 else {"ignore_index": self.spec.ignore_index}
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.spec.vocab,
                                      num_items_in_batch=num_items_in_batch, **extra)
        else:
            loss = causal_lm_loss(logits, labels, reduction=self.spec.reduction,
                                  ignore_index=self.spec.ignore_index, num_items_in_batch=num_items_in_batch,
                                  label_smoothing=self.spec.label_smoothing)
        return loss, logits


def build_model(spec: ModelSpec, seed: int, dtype: torch.dtype) -> TinyCausalLM:
    """Initial weights depend only on (spec, seed): drawn in fp32, then cast, on every process alike.
    The cast is part of making them (inside seeded's exact_inputs): the subject gets the same cast
    values, so a rerun with other roundings (parity's rounding samples) must not move it. Outside, it
    moved every bf16 initial weight by up to a unit, and the samples' master-weight error with it
    (2e-3 where the reference's was 4e-7, found while sampling a master bound)."""
    with seeded(seed):
        return TinyCausalLM(spec).to(dtype)


def capture_head_input_and_grad(model: TinyCausalLM, sink: dict) -> None:
    """After each forward, sink["x"] holds the head's input (the logits stage's input, parity/checks/
    stages.py); after each backward, sink["h"] the gradient that reached it."""

    def pre_hook(module, args):
        sink["x"] = args[0].detach()
        args[0].register_hook(lambda grad: sink.__setitem__("h", grad))
        # returning None keeps the head's input unchanged

    model.head.register_forward_pre_hook(pre_hook)
