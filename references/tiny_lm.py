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

from references.loss import causal_lm_loss, continued_shift_labels
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
    # nn.Embedding(scale_grad_by_freq=True): each lookup's gradient divided by its id's count in the batch.
    scale_grad_by_freq: bool = False
    # nn.Embedding(max_norm=...): every looked-up row whose L2 norm exceeds it is renormalised to it, in place, by
    # the lookup itself (torch.embedding_renorm_). None: no renormalisation.
    max_norm: float | None = None
    # Gemma3's scaled word embedding: lookups times sqrt(hidden) (ScaledWordEmbedding).
    embed_scale: bool = False
    label_smoothing: float = 0.0  # the CE's, with torch's F.cross_entropy semantics (references/loss.py)
    # Llama-shaped blocks between the embedding and proj (TinyLlamaModel); 0: TinyCausalLM, no blocks.
    blocks: int = 0
    # "shift_labels": the model hands its loss pre-shifted labels (references/loss.py continued_shift_labels)
    # beside the labels, as HF callers do under sequence parallelism; "labels": the loss shifts them itself.
    labels_form: str = "labels"


class ScaledWordEmbedding(nn.Embedding):
    """transformers' Gemma3TextScaledWordEmbedding written out in plain torch: a float32 buffer sqrt(hidden), cast
    with the model, and a forward that multiplies the lookup by it cast to the weight dtype (modeling_gemma3.py)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, scale_grad_by_freq: bool,
                 max_norm: float | None = None):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq,
                         max_norm=max_norm)
        self.register_buffer("embed_scale", torch.tensor(embedding_dim ** 0.5), persistent=False)

    def forward(self, input_ids):
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


class TinyCausalLM(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        if spec.embed_scale:
            self.embed_tokens = ScaledWordEmbedding(spec.vocab, spec.hidden, spec.padding_idx, spec.scale_grad_by_freq,
                                                    spec.max_norm)
        else:
            self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden, padding_idx=spec.padding_idx,
                                             scale_grad_by_freq=spec.scale_grad_by_freq, max_norm=spec.max_norm)
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

    def _shift_labels(self, labels) -> dict:
        # Passed only when set, as an HF caller passes it: the default path's call is unchanged.
        return {"shift_labels": continued_shift_labels(labels)} if self.spec.labels_form == "shift_labels" else {}

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
                                      num_items_in_batch=num_items_in_batch, **extra, **self._shift_labels(labels))
        else:
            loss = causal_lm_loss(logits, labels, reduction=self.spec.reduction,
                                  ignore_index=self.spec.ignore_index, num_items_in_batch=num_items_in_batch,
                                  label_smoothing=self.spec.label_smoothing, **self._shift_labels(labels))
        return loss, logits


class TinyAttention(nn.Module):
    """Llama's attention projections by name (q/k/v_proj, o_proj), mixing per feature instead of over the
    sequence: column shards of q, k, v feeding a row shard of o_proj then compute exactly what the whole
    block computes, as real attention does for whole heads, and the head's checks need no more."""

    def __init__(self, hidden: int):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))

    def forward(self, x):
        return self.o_proj(self.q_proj(x) * torch.sigmoid(self.k_proj(x)) + self.v_proj(x))


class TinyMLP(nn.Module):
    """Llama's MLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, 2 * hidden, bias=False)
        self.up_proj = nn.Linear(hidden, 2 * hidden, bias=False)
        self.down_proj = nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class TinyLlamaBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.self_attn = TinyAttention(hidden)
        self.mlp = TinyMLP(hidden)

    def forward(self, x):
        x = x + self.self_attn(x)
        return x + self.mlp(x)


class TinyLlamaModel(TinyCausalLM):
    """TinyCausalLM with ``layers``, a ModuleList of Llama-shaped blocks, between the embedding and proj: a
    user's own (non-HF) model, without a config or a tp_plan. Its class name ends in Model and its blocks sit
    in a ModuleList, which is what DeepSpeed's heuristic AutoTP parser looks for. A head_name under ``layers.``
    registers the head in that block."""

    def __init__(self, spec: ModelSpec):
        super().__init__(spec)
        head = self.head  # drawn before the blocks, wherever it is registered: the same weights for every head_name
        self.layers = nn.ModuleList(TinyLlamaBlock(spec.hidden) for _ in range(spec.blocks))
        if spec.head_name.startswith("layers."):
            # Registered inside a block ("layers.1.lm_head"), as a per-block multi-token-prediction head is, and still
            # applied as the output head after proj: where a module is registered is what AutoTP's routing reads.
            self.replace_head(head)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for block in self.layers:
            x = block(x)
        return torch.tanh(self.proj(x))


def build_model(spec: ModelSpec, seed: int, dtype: torch.dtype) -> TinyCausalLM:
    """Initial weights depend only on (spec, seed): drawn in fp32, then cast, on every process alike.
    The cast is part of making them (inside seeded's exact_inputs): the subject gets the same cast
    values, so a rerun with other roundings (parity's rounding samples) must not move it. Outside, it
    moved every bf16 initial weight by up to a unit, and the samples' master-weight error with it
    (2e-3 where the reference's was 4e-7, found while sampling a master bound)."""
    with seeded(seed):
        return (TinyLlamaModel if spec.blocks else TinyCausalLM)(spec).to(dtype)


def capture_head_input_and_grad(model: TinyCausalLM, sink: dict, head: nn.Module | None = None) -> None:
    """After each forward, sink["x"] holds the head's input (the logits stage's input, parity/checks/
    stages.py); after each backward, sink["h"] the gradient that reached it. ``head``: the module taken for the
    head where it is not the tiny LM's ``model.head`` (another model's)."""

    def pre_hook(module, args):
        sink["x"] = args[0].detach()
        args[0].register_hook(lambda grad: sink.__setitem__("h", grad))
        # returning None keeps the head's input unchanged

    (model.head if head is None else head).register_forward_pre_hook(pre_hook)
