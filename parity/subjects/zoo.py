"""DeepSpeed 0.19.8 AutoTP on the causal-LM architectures of transformers 5.24, each built tiny (references/zoo.py).

The ``arch`` axis names the model_type; the model is ``references.zoo.build`` of it, trained on the ranks through
deepspeed.initialize (EngineHead, driven by parity/subjects/driver.py) with the model's own forward and its own
``loss_function`` (labels passed). The reference is the same class unsharded, its own forward and loss, through
references/trajectory.py train_reference. Claims are derived from the HF plan read off the built model, not from
DeepSpeed. How the engine reads the plan: docs/subjects.md#hf-tp_plan-heads; the zoo: docs/subjects.md#zoo-subjects.
"""
from __future__ import annotations

import functools
import inspect
import json
import re
from importlib.util import find_spec
from pathlib import Path

import torch

from parity.observe.dtypes import DTYPES
from parity.subjects.base import Claims
from parity.subjects.deepspeed_autotp import EngineHead
from parity.subjects.hf_tp_plan import effective_hf_plan
from references import zoo
from references.tiny_lm import ModelSpec, capture_head_input_and_grad
from references.trajectory import Trajectory, train_reference

# clip (quiet at 0: no case id changes) and gas 1 and 4: what `parity check` reads from a user's gradient_clipping and
# gradient_accumulation_steps (parity/matrix/user_config.py).
ZOO_AXES = {"arch": None, "arch_config": None, "vocab": (zoo.VOCAB,), "dtype": ("fp32", "bf16"), "zero": (0, 2),
            "gas": (1, 2, 4), "tp": (2, 3), "clip": None, "device": None}
# tp_shard._KV_HEAD_ATTRS: the config attributes AutoTP reads its kv-head count from, in its probe order.
KV_HEAD_ATTRS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv", "kv_n_heads",
                 "num_attention_heads", "n_heads", "attention_heads")
# tp_shard.get_shard_size: layers whose name holds one of these are split near-evenly, never by kv heads.
NEAR_EVEN_NAMES = ("mlp", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")
CENSUS = Path(__file__).resolve().parents[2] / "results" / "zoo" / "census.json"
VOCAB_PARALLEL_MICRO = {"logits": -1, "loss": None, "head_input_grad": None}


@functools.lru_cache(maxsize=None)
def census_rows() -> dict:
    """model_type -> its row of results/zoo/census.json (empty where the file is absent: an installed wheel)."""
    if not CENSUS.is_file():
        return {}
    return {r["model_type"]: r for r in json.loads(CENSUS.read_text())["rows"]}


def hf_plan(model) -> dict:
    """The plan the model carries: config.base_model_tp_plan, then the class's and the instance's _tp_plan, later
    entries winning; a "model."-prefixed entry whose unprefixed pattern an earlier plan states is the same entry
    (transformers writes the base plan again, prefixed, into the instance plan)."""
    merged: dict = {}
    for plan in (getattr(model.config, "base_model_tp_plan", None), getattr(type(model), "_tp_plan", None),
                 model.__dict__.get("_tp_plan")):
        for pattern, style in (plan or {}).items():
            short = pattern[len("model."):] if pattern.startswith("model.") else pattern
            if pattern.startswith("model.") and short in {p[len("model."):] if p.startswith("model.") else p
                                                          for p in merged}:
                continue
            merged[pattern] = style
    return merged


def plan_style(plan: dict, module_path: str) -> str | None:
    """The style of the last plan entry whose pattern (``*`` any run of characters) ends ``module_path`` at a
    name boundary; None: the plan says nothing of it."""
    found = None
    for pattern, style in plan.items():
        regex = "(^|.*\\.)" + re.escape(pattern).replace("\\*", ".*") + "$"
        if re.match(regex, module_path):
            found = style.lower()
    return found


@functools.lru_cache(maxsize=None)
def planned(arch: str, user: str = "") -> dict:
    """What the claims are derived from, read off the built fp32 model: its head and embedding paths, whether they
    are tied, the plan, and every nn.Linear the plan names with that style (``user``: the arch_config axis)."""
    model = zoo.build(arch, user=user)
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    plan = hf_plan(model)
    traits = zoo.traits(model)
    linears = {name: plan_style(plan, name) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m is not head}
    return {"head": zoo._module_path(model, head), "embedding": zoo._module_path(model, emb),
            "tied": head is not None and head.weight is emb.weight, "plan": plan,
            "head_bias": getattr(head, "bias", None) is not None,
            # The logits are a function of the head's product (softcap, logit scale), not the product itself.
            "logits_from_head": not (traits["softcap"] or traits["logit_scale"] not in (None, 1)
                                     or traits["logits_scaling"] not in (None, 1)),
            # DeepSpeed's documented rule for a vocabulary-parallel embedding (layers.py:1110-1120
            # VocabParallelEmbedding.validate_embedding): nn.Embedding's own forward, or Gemma3's scaled one.
            "embedding_shardable": (type(emb).forward is torch.nn.Embedding.forward
                                    or type(emb).__name__ == "Gemma3TextScaledWordEmbedding"),
            "linears": {n: s for n, s in linears.items() if s is not None},
            "shapes": {name: tuple(m.weight.shape) for name, m in model.named_modules()
                       if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2},
            "kv": kv_heads(model.config),
            "vocab": zoo._text(model.config).vocab_size}


def freeze_other_towers(model) -> None:
    """A wrapper's towers that text-only batches never reach (vision, audio) are frozen, as a user fine-tuning the
    text side freezes them: they get no gradient, and an optimizer step would have nothing to apply."""
    if zoo._text(model.config) is model.config:
        return
    trained = {id(p) for m in (model.get_decoder(), model.get_output_embeddings()) for p in m.parameters()}
    for p in model.parameters():
        if id(p) not in trained:
            p.requires_grad_(False)


def kv_heads(config) -> int | None:
    """The kv-head count AutoTP shards attention by (tp_shard.AutoTPMeta.from_model_config): the text config's
    (``text_config`` where the config has one), first of KV_HEAD_ATTRS that is set."""
    config = getattr(config, "text_config", None) or config
    return next((getattr(config, a) for a in KV_HEAD_ATTRS if getattr(config, a, None) is not None), None)


def autotp_sizes(total: int, tp: int, kv: int | None, name: str) -> list[int]:
    """The split DeepSpeed documents for a layer (tp_shard.get_shard_size, "a known kv-head count allows uneven
    division"): whole kv heads per rank where the dimension is a multiple of the kv-head count and the layer is no
    MLP or output head; near-even otherwise (tp_grain_size 1)."""
    if (kv and total % kv == 0 and not any(w in name for w in NEAR_EVEN_NAMES)
            and name not in ("lm_head", "embed_out")):
        return [total * (kv // tp + (r < kv % tp)) // kv for r in range(tp)]
    return [total // tp + (r < total % tp) for r in range(tp)]


def contiguous(sizes: list[int]) -> tuple:
    """A layout of one contiguous range per rank, in rank order."""
    starts = [sum(sizes[:r]) for r in range(len(sizes))]
    return tuple(((a, a + n),) for a, n in zip(starts, sizes))


def packed(parts: list[int], tp: int, kv: int | None, name: str) -> tuple:
    """Sub-parameters (gate and up halves, q/k/v blocks) stacked along dim 0, each split on its own by
    autotp_sizes; a rank holds its piece of every one, in order (SubParamColumnParallel)."""
    layout, offset = [[] for _ in range(tp)], 0
    for part in parts:
        for r, rng in enumerate(contiguous(autotp_sizes(part, tp, kv, name))):
            layout[r].append((offset + rng[0][0], offset + rng[0][1]))
        offset += part
    return tuple(tuple(r) for r in layout)


def layer_claims(linears: dict, tp: int = 2, kv: int | None = None, names: dict | None = None,
                 weights: dict | None = None) -> tuple[dict, dict, dict]:
    """Module types, parameter shards and layouts of the plan's layers: colwise (and the gathered styles) -> a
    column LinearLayer, weight and bias sharded on dim 0; rowwise -> LinearAllreduce, weight on dim 1, bias whole;
    replicated_with_grad_allreduce and embedding_rowwise on a Linear -> left whole (a skip spec). ``names``: the
    name DeepSpeed gives each layer (its split depends on it, autotp_sizes); ``weights``: their full shapes."""
    types, shards, layouts = {}, {}, {}
    for name, style in linears.items():
        ds_name = (names or {}).get(name, name)
        shape = (weights or {}).get(name)
        if style in ("colwise", "colwise_rep", "colwise_gather_output"):
            types[name] = "LinearLayer"
            shards.update({f"{name}.weight": 0, f"{name}.bias": 0})
            if shape is not None:
                layouts[f"{name}.weight"] = layouts[f"{name}.bias"] = contiguous(
                    autotp_sizes(shape[0], tp, kv, ds_name))
        elif style == "rowwise":
            types[name] = "LinearAllreduce"
            shards.update({f"{name}.weight": 1, f"{name}.bias": None})
            if shape is not None:
                layouts[f"{name}.weight"] = contiguous(autotp_sizes(shape[1], tp, kv, ds_name))
        elif style in ("replicated_with_grad_allreduce", "embedding_rowwise"):
            shards.update({f"{name}.weight": None, f"{name}.bias": None})
    return types, shards, layouts


def model_inputs(model, batch: dict) -> dict:
    """The forward's keyword arguments for one micro-batch: the ids, zero token_type_ids where the forward takes them
    (as references.zoo.forward_backward), and the labels."""
    kwargs = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        kwargs["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return kwargs


def move_media_ids(model) -> None:
    """A wrapper's own token ids (image, audio, ...) moved past the text vocabulary: the suite's batches draw ids
    from all of it, and a media token without its pixels is an error in a VLM; the batches stay the suite's."""
    text = zoo._text(model.config)
    if text is model.config:
        return
    media = zoo.special_ids(model.config) - zoo.special_ids(text)
    keys = [k for k, v in model.config.to_dict().items()
            if not isinstance(v, dict) and zoo._is_id_key(k) and v in media]
    for i, key in enumerate(sorted(keys)):
        setattr(model.config, key, text.vocab_size + 1000 + i)


def head_input_hook(model, sink) -> None:
    """The head's input and its gradient (references.tiny_lm.capture_head_input_and_grad), at the module the model's
    get_output_embeddings() returns (after AutoTP: the module that replaced the head; under transformers' TP the
    same module with its forward replaced: the pre-hook sees the hidden state before the style's input transform)."""
    capture_head_input_and_grad(model, sink, model.get_output_embeddings())


class ZooHead(EngineHead):
    """A zoo architecture through deepspeed.initialize; subclasses say what DeepSpeed is told of the head."""
    axes = ZOO_AXES
    defaults = {"vocab": zoo.VOCAB}
    feature = None
    reference_imports = ("transformers.models.auto.modeling_auto",)

    # -- the model --------------------------------------------------------------------------------
    def info(self, values: dict) -> dict:
        return planned(values["arch"], values["arch_config"])

    def model_spec(self, values):
        info = self.info(values)
        return ModelSpec(vocab=values["vocab"], hidden=0, bias=info["head_bias"], head_name=info["head"],
                         tied=info["tied"])

    def build(self, values: dict, dtype: torch.dtype):
        model = zoo.build(values["arch"], dtype, self.training_spec(values).seed, user=values["arch_config"])
        vocab = zoo._text(model.config).vocab_size
        if vocab != values["vocab"]:  # the batches draw ids from values["vocab"]
            raise ValueError(f"{values['arch']}: the tiny config's vocabulary is {vocab}, the case's {values['vocab']}")
        if model._can_set_experts_implementation():
            # The experts' eager loop: torch's grouped_mm (transformers' default) takes no float64 operands, which
            # the oracle trains in; eager is the class's own plain-PyTorch path, on the ranks and in the reference.
            model.set_experts_implementation("eager")
        move_media_ids(model)
        freeze_other_towers(model)
        return model

    def tensor_parallel_config(self, values):
        return {}  # no partition_config: the engine takes the model's HF plan (or, without one, its heuristic)

    def unavailable_reason(self, values):
        """An architecture whose census build failed is skipped by name with the census reason, so a case file
        may list every architecture (cases/zoo/full.toml)."""
        reason = super().unavailable_reason(values)
        if reason is None and find_spec("transformers") is None:
            reason = "transformers is not installed (pip install -e '.[hf]')"
        stored = zoo.config_store() / f"{values['arch_config']}.json"
        if reason is None and values["arch_config"] and not stored.is_file():
            reason = f"arch_config {values['arch_config']}: no {stored} (parity check --arch CONFIG_JSON stores it)"
        row = census_rows().get(values["arch"])
        if reason is None and row is not None and row["status"] != "built":
            reason = f"{values['arch']} cannot be built here (docs/zoo-census.md): {row['reason']}"
        return reason

    # -- parent: the unsharded reference ------------------------------------------------------------
    def reference(self, values: dict, compute_dtype=None) -> Trajectory:
        """The same class unsharded: its own forward and its own loss (labels passed)."""
        def forward(model, batch, num_items):
            out = model(**model_inputs(model, batch))
            return out.loss, out.logits

        return train_reference(self.model_spec(values), self.training_spec(values), DTYPES[values["dtype"]],
                               compute_dtype, build=lambda dtype: self.build(values, dtype), forward=forward,
                               capture=self.capture_head_input)

    # -- ranks --------------------------------------------------------------------------------------
    def forward(self, engine, batch, num_items, spec):
        out = engine(**model_inputs(engine.module, batch))
        return out.loss, out.logits

    capture_head_input = staticmethod(head_input_hook)

    def model_facts(self, model):
        return {"hf_tp_plan": dict(effective_hf_plan(model))}

    # -- what DeepSpeed must build ------------------------------------------------------------------
    def vocab_parallel(self, values) -> bool:
        """The engine's auto path (engine.py:1113-1125, vocab_parallel_lm_head unset): a plan with an
        embedding_rowwise entry and a head tied to an embedding -> vocabulary-parallel head and embedding, unless
        the embedding is one DeepSpeed cannot shard (then both stay replicated, engine.py:1163-1177)."""
        info = self.info(values)
        return (info["tied"] and info["embedding_shardable"]
                and "embedding_rowwise" in {s.lower() for s in info["plan"].values()})

    def claims(self, values):
        info = self.info(values)
        head, emb = info["head"], info["embedding"]
        # The plan path names each layer by its full path (AutoTP._replace_module under a partition_config).
        types, shards, layouts = layer_claims(info["linears"], values["tp"], info["kv"], weights=info["shapes"])
        return self.head_claims(values, info, types, shards, layouts)

    def head_claims(self, values, info, types, shards, layouts):
        """The claims with the head's and the embedding's added to the layers' (types, shards, layouts)."""
        head, emb = info["head"], info["embedding"]
        if self.vocab_parallel(values):
            types.update({head: "VocabParallelLinear", "loss_function": "VocabParallelCausalLMLoss"})
            if info["tied"]:
                types[emb] = "VocabParallelEmbedding"
                shards[f"{emb}.weight"] = 0
            else:
                shards.update({f"{head}.weight": 0, f"{head}.bias": 0, f"{emb}.weight": None})
            return Claims(module_types=types, param_shards=shards, param_layout=layouts,
                          micro_records=VOCAB_PARALLEL_MICRO,
                          loss_backend="torch", logits_from_head=info["logits_from_head"],
                          shared_params=((f"{head}.weight", f"{emb}.weight"),) if info["tied"] else ())
        style = self.head_style(values, info)
        if style in ("colwise_gather_output", "colwise_rep") and not info["tied"]:
            types[head], shards[f"{head}.weight"], shards[f"{head}.bias"] = "LinearLayer", 0, 0
        else:
            # A tied head the plan gathers: AutoTP's gathered-column tie fallback keeps head and embedding whole
            # (docs/subjects.md#hf-tp_plan-heads); a head the plan does not name stays a replicated nn.Linear.
            types[head], shards[f"{head}.weight"] = "Linear", None
        shards[f"{emb}.weight"] = None
        return Claims(module_types=types, param_shards=shards, param_layout=layouts,
                      logits_from_head=info["logits_from_head"],
                      shared_params=((f"{head}.weight", f"{emb}.weight"),) if info["tied"] else ())

    def head_style(self, values, info) -> str | None:
        """The plan style that reaches the head when it is not vocabulary-parallel (None: it stays nn.Linear)."""
        return plan_style(info["plan"], info["head"])


class ZooHFPlan(ZooHead):
    name = "zoo_hf_plan"
    feature = None  # the head is gathered column, replicated or vocab-parallel by architecture: no one row
    description = ("A transformers architecture built tiny from its config class (arch), DeepSpeed AutoTP from the "
                   "model's own HF tp_plan (no partition_config), its own forward and loss_function; claims from "
                   "the plan.")


class ZooVocabParallel(ZooHead):
    name = "zoo_vocab_parallel"
    feature = "vocab-parallel head + CE"
    description = ("zoo_hf_plan with tensor_parallel.vocab_parallel_lm_head true: the head VocabParallelLinear (and a "
                   "tied embedding VocabParallelEmbedding), DeepSpeed's VocabParallelCausalLMLoss as the model's "
                   "loss_function.")

    def tensor_parallel_config(self, values):
        return {"vocab_parallel_lm_head": True}

    def vocab_parallel(self, values):
        return True


# -- AutoTP's heuristic parser (the path of a model without a plan) -------------------------------------------------
# auto_tp.py AutoTP.tp_parser: the layer-norm names that end a run of Linears, and the model prefixes it refuses.
HEURISTIC_NORM_NAMES = ("LayerNorm", "layer_norm", "ln_1", "ln_2")
HEURISTIC_UNSUPPORTED = ("deberta", "flaubert", "fsmt", "gpt2", "led", "longformer", "xlm", "xlnet")
# AutoTP._replace: layers it leaves whole (an MoE router, MLA's low-rank projections) and the fused q/k/v names
# (fusedqkv_utils.require_tp_fused_qkvw) it cuts with a model-specific layout.
HEURISTIC_SKIP = ("q_a_proj", "kv_a_proj_with_mqa")
FUSED_QKV_NAMES = ("qkv_proj", "query_key_value", "attn.Wqkv", "self_attn.W_pack", "c_attn")


def block_classes(model) -> list:
    """AutoTP.get_module_list: one instance of each distinct class among the children of every nn.ModuleList the
    walk reaches (it descends through other children, not into a ModuleList's own children)."""
    found = []
    for child in model.children():
        if isinstance(child, torch.nn.ModuleList):
            found += [m for m in child.children() if type(m).__name__ not in {type(f).__name__ for f in found}]
        else:
            found += [m for m in block_classes(child) if type(m).__name__ not in {type(f).__name__ for f in found}]
    return found


def _layer_names(parent: str, module) -> list[str]:
    """AutoTP.get_layers: a Linear child as "parent.key", a layer norm as "ln", deeper modules named by their own
    parent's key only."""
    names = []
    for key, sub in module._modules.items():
        if isinstance(sub, torch.nn.Linear):
            names.append(f"{parent}.{key}")
        elif isinstance(sub, torch.nn.LayerNorm) or key in ("LayerNorm", "layer_norm"):
            names.append("ln")
        elif sub is not None:
            names += _layer_names(key, sub)
    return names


def all_reduce_names(model, block) -> set[str]:
    """AutoTP.tp_parser's row-parallel ("all-reduce") layers of a block class, as its docstring-less rules read
    them: the last Linear before each layer norm, and every out_proj, o_proj, down_proj (plus its model-named
    cases: GPTNeoX attention.dense, Falcon/ChatGLM self_attention.dense, ChatGLM dense_4h_to_h, Mixtral w2, Phi
    self_attn.dense); a norm's predecessor is taken cyclically, as the parser indexes it."""
    names = []
    for key, sub in block._modules.items():
        if isinstance(sub, torch.nn.Linear):
            names.append(f".{key}")
        elif isinstance(sub, torch.nn.LayerNorm) or key in HEURISTIC_NORM_NAMES:
            names.append("ln")
        elif sub is not None:
            names += _layer_names(key, sub)
    model_str, block_type = str(model), str(type(block))
    gems = set()
    for i, layer in enumerate(names):
        if layer == "ln":
            # names[i - 1] at i = 0 is the last name (the parser's own indexing): a pre-norm block's first norm
            # names the block's last Linear.
            if names[i - 1] != "ln":
                gems.add(names[i - 1])
        elif any(w in layer for w in ("out_proj", "o_proj", "down_proj")) or (
                "attention.dense" in layer and "GPTNeoX" in model_str) or (
                "self_attention.dense" in layer and "falcon" in block_type) or (
                "w2" in layer and "Mixtral" in block_type) or (
                "self_attn.dense" in layer and "Phi" in block_type) or (
                "ChatGLM" in model_str and ("self_attention.dense" in layer or "dense_4h_to_h" in layer)):
            gems.add(layer)
    return gems


# fusedqkv_utils.FUSED_QKV_TYPE_DICT: the fused q/k/v layout by the block's class name (the longest name found in
# the block's repr); an unnamed block is cut the bloom way.
FUSED_QKV_TYPES = {"CodeGenBlock": "codegen", "BloomBlock": "bloom", "GLMBlock": "glm", "MPTBlock": "glm",
                   "MptBlock": "glm", "BaichuanLayer": "glm", "QWenBlock": "qwen", "FalconDecoderLayer": "bloom",
                   "GPTBigCodeBlock": "bigcode", "DecoderLayer": "glm", "Phi3DecoderLayer": "phi3"}


def fused_parts(block, config, shape) -> list[int] | None:
    """The sub-parameters a fused q/k/v weight is cut into, each split on its own (fusedqkv_utils
    fused_qkv_subparam_sizes, under no layer name): bloom one block; glm and qwen three thirds (q, k, v of
    n_embd and two kv widths with 2 kv heads); phi3 q, k, v by head width; codegen and bigcode: None."""
    found = [k for k in FUSED_QKV_TYPES if k in str(block)]
    kind = FUSED_QKV_TYPES[max(found, key=len)] if found else "bloom"
    config = getattr(config, "text_config", None) or config
    kv, total = kv_heads(config), shape[0]
    if kind == "bloom":
        return [total]
    if kind in ("glm", "qwen"):
        n_embd = getattr(config, "n_embd", None) or getattr(config, "hidden_size", None)
        return [n_embd, (total - n_embd) // 2, (total - n_embd) // 2] if kv == 2 else [total // 3] * 3
    if kind == "phi3":
        heads = next(getattr(config, a) for a in ("num_attention_heads", "num_heads", "n_heads", "n_head")
                     if getattr(config, a, None) is not None)
        kv_dim = kv * (shape[1] // heads)
        return [total - 2 * kv_dim, kv_dim, kv_dim]
    return None


def heuristic_refusal(model) -> str | None:
    """What AutoTP.supported / tp_parser refuse before touching the model (their assertion messages), else None."""
    text = str(model)
    key = re.search(r": (.*?)Model", text) or re.search(r": (.*?)Stack", text) or re.match(r"(.*?)Model", text)
    if key is None:
        return "Not able to determine model policy automatically"
    if key.group(1).lower() in HEURISTIC_UNSUPPORTED:
        return "AutoTP not supported for model"
    if not any(all_reduce_names(model, b) for b in block_classes(model)):
        return "Not able to determine model policy automatically"
    return None


def heuristic_layers(model, tp: int, kv: int | None) -> tuple[dict, dict, dict]:
    """(module types, shards, layouts) of every layer the heuristic walk replaces: each nn.Linear inside every
    instance of a parsed block class (replace_transformer_layer -> AutoTP._replace_module, named "parent.leaf"):
    an MoE router ("mlp.gate", Qwen2-MoE's shared_expert_gate) and MLA's low-rank projections stay whole; gate_up_proj is a packed gate/up
    column pair; a parsed all-reduce layer or any down_proj is a row LinearAllreduce (weight dim 1, bias whole);
    a fused q/k/v name a fused column layer (dim 0, its model-specific layout not claimed); any other Linear a
    column LinearLayer; an nn.Embedding in a block is cut along its hidden dim (_slice_embedding)."""
    types, shards, layouts = {}, {}, {}
    policies = {type(b): all_reduce_names(model, b) for b in block_classes(model)}
    policies = {cls: gems for cls, gems in policies.items() if gems}
    for path, block in model.named_modules():
        if type(block) not in policies:
            continue
        gems = policies[type(block)]

        def walk(module, prefix, parent):
            for key, child in module.named_children():
                full, name = f"{prefix}.{key}", f"{parent}.{key}"
                if isinstance(child, torch.nn.Linear):
                    linear(child, full, name)
                elif isinstance(child, torch.nn.Embedding):
                    shards[f"{full}.weight"] = 1
                    layouts[f"{full}.weight"] = contiguous(autotp_sizes(child.weight.shape[1], tp, kv, name))
                else:
                    walk(child, full, key)

        def linear(child, full, name):
            out_f, in_f = child.weight.shape
            if (name in ("mlp.gate", "block_sparse_moe.gate") or any(w in name for w in HEURISTIC_SKIP)
                    or name == "mlp.shared_expert_gate" and "qwen2_moe" in str(type(block))):
                shards.update({f"{full}.weight": None, f"{full}.bias": None})
            elif "gate_up_proj" in name:
                types[full] = "GateUpPack_LinearLayer"
                shards.update({f"{full}.weight": 0, f"{full}.bias": 0})
                layouts[f"{full}.weight"] = layouts[f"{full}.bias"] = packed([out_f // 2] * 2, tp, kv, "mlp")
            elif name in gems or "down_proj" in name:
                types[full] = "LinearAllreduce"
                shards.update({f"{full}.weight": 1, f"{full}.bias": None})
                layouts[f"{full}.weight"] = contiguous(autotp_sizes(in_f, tp, kv, name))
            elif any(w in name for w in FUSED_QKV_NAMES):
                types[full] = "fused_LinearLayer"
                shards.update({f"{full}.weight": 0, f"{full}.bias": 0})
                parts = fused_parts(block, model.config, child.weight.shape)
                if parts is not None:  # codegen's and gpt_bigcode's layouts have no per-part description
                    layouts[f"{full}.weight"] = layouts[f"{full}.bias"] = packed(parts, tp, kv, "None")
            else:
                types[full] = "LinearLayer"
                shards.update({f"{full}.weight": 0, f"{full}.bias": 0})
                layouts[f"{full}.weight"] = layouts[f"{full}.bias"] = contiguous(autotp_sizes(out_f, tp, kv, name))

        walk(block, path, "")
    return types, shards, layouts


def drop_plan(model) -> None:
    """The model as one without an HF plan reaches DeepSpeed: config.base_model_tp_plan (and the text config's),
    the instance's _tp_plan and the class's cleared. The class plan is cleared on a subclass of the same name made
    for this model, so the class itself (and every other case in the process) keeps its plan."""
    for config in {id(c): c for c in (model.config, zoo._text(model.config))}.values():
        config.base_model_tp_plan = None
    model.__dict__["_tp_plan"] = None
    cls = type(model)
    model.__class__ = type(cls.__name__, (cls,), {"_tp_plan": None, "__module__": cls.__module__})


@functools.lru_cache(maxsize=None)
def heuristic_info(arch: str, tp: int, user: str = "") -> dict:
    """planned(arch) with the heuristic's refusal and its layers' claims, read off the built fp32 model."""
    model = zoo.build(arch, user=user)
    info = planned(arch, user)
    refusal = heuristic_refusal(model)
    layers = ({}, {}, {}) if refusal else heuristic_layers(model, tp, info["kv"])
    return {**info, "refusal": refusal, "layers": layers}


class ZooHeuristic(ZooHead):
    name = "zoo_heuristic"
    feature = None
    axes = {**ZOO_AXES, "vocab_parallel_lm_head": ("false", "true")}
    defaults = {"vocab": zoo.VOCAB, "vocab_parallel_lm_head": "false"}
    description = ("A zoo architecture with its HF plan removed (config.base_model_tp_plan and the _tp_plan "
                   "attributes cleared), no partition_config: AutoTP's heuristic parser shards its blocks; "
                   "vocab_parallel_lm_head true or false; claims from the parser's documented name rules.")

    def build(self, values, dtype):
        model = super().build(values, dtype)
        drop_plan(model)
        return model

    def model_facts(self, model):
        return {**super().model_facts(model), "heuristic_refusal": heuristic_refusal(model)}

    def tensor_parallel_config(self, values):
        return {"vocab_parallel_lm_head": values["vocab_parallel_lm_head"] == "true"}

    def vocab_parallel(self, values):
        return values["vocab_parallel_lm_head"] == "true"

    def head_style(self, values, info):
        return None  # set_lm_head returns at once in training mode: nothing replaces a top-level head

    def claims(self, values):
        info = heuristic_info(values["arch"], values["tp"], values["arch_config"])
        types, shards, layouts = (dict(x) for x in info["layers"])
        return self.head_claims(values, info, types, shards, layouts)


# -- tensor_parallel.preset_model -----------------------------------------------------------------------------------
# model_type -> the AutoTPPresets name a user of that architecture picks (autotp_config.AutoTPPresets.get_preset);
# chatglm has no causal-LM class in transformers 5.24.
PRESET_OF = {"llama": "llama", "qwen2": "qwen2", "phi3": "phi3", "mixtral": "mixtral", "deepseek_v2": "deepseek_v2",
             "bloom": "bloom"}
# The presets' layer specs as AutoTPPresets documents them (autotp_config.py): (parameter-name regex, partition
# type, shape). tests/subjects/test_zoo.py holds them equal to the installed DeepSpeed's.
PRESET_SPECS = {
    "llama": ((r".*\.self_attn\.o_proj\.weight$", "row", None), (r".*\.self_attn\.[qkv]_proj\.weight$", "column", None),
              (r".*\.mlp\.down_proj\.weight$", "row", None), (r".*\.mlp\.(up|gate)_proj\.weight$", "column", None)),
    "bloom": ((r".*\.self_attention\.dense\.weight$", "row", None),
              (r".*\.self_attention\.query_key_value\.weight$", "column", None),
              (r".*\.mlp\.dense_4h_to_h\.weight$", "row", None), (r".*\.mlp\.dense_h_to_4h\.weight$", "column", None)),
    "mixtral": ((r".*\.self_attn\.o_proj\.weight$", "row", None), (r".*\.self_attn\.[qkv]_proj\.weight$", "column", None),
                (r".*\.block_sparse_moe\.experts\.\d+\.w2\.weight$", "row", None),
                (r".*\.block_sparse_moe\.experts\.\d+\.w[13]\.weight$", "column", None),
                (r".*\.block_sparse_moe\.gate\.weight$", "skip", None)),
    "deepseek_v2": ((r".*\.self_attn\.o_proj\.weight$", "row", None),
                    (r".*\.self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight$", "skip", None),
                    (r".*\.self_attn\.(q_b_proj|kv_b_proj)\.weight$", "column", None),
                    (r".*\.mlp\.experts\.\d+\.down_proj\.weight$", "row", None),
                    (r".*\.mlp\.experts\.\d+\.(up|gate)_proj\.weight$", "column", None),
                    (r".*\.mlp\.gate\.weight$", "skip", None),
                    (r".*\.mlp\.shared_experts\.down_proj\.weight$", "row", None),
                    (r".*\.mlp\.shared_experts\.(up|gate)_proj\.weight$", "column", None)),
    "phi3": ((r".*\.self_attn\.o_proj\.weight$", "row", None), (r".*\.self_attn\.qkv_proj\.weight$", "column", (3, -1)),
             (r".*\.mlp\.down_proj\.weight$", "row", None), (r".*\.mlp\.gate_up_proj\.weight$", "column", (2, -1))),
}
PRESET_SPECS["qwen2"] = PRESET_SPECS["llama"]


def preset_layers(arch: str, preset: str, tp: int, kv: int | None, shapes: dict) -> tuple[dict, dict, dict]:
    """(module types, shards, layouts) the preset's specs make of every module with a 2-D weight (the partition_config
    walk, AutoTP._replace_with_config): the first spec whose regex matches "<path>.weight"; row -> LinearAllreduce
    (SubParamLinearAllreduce with a shape), column -> LinearLayer (SubParamLinearLayer: each of shape[0] equal
    sub-parameters split on its own), skip or no spec -> left whole. Layers are split by their full path."""
    types, shards, layouts = {}, {}, {}
    for path, shape in shapes.items():
        spec = next((s for s in PRESET_SPECS[preset] if re.match(s[0], f"{path}.weight")), None)
        if spec is None or spec[1] == "skip":
            continue
        _, kind, sub = spec
        if kind == "row":
            types[path] = "SubParamLinearAllreduce" if sub else "LinearAllreduce"
            shards.update({f"{path}.weight": 1, f"{path}.bias": None})
            layouts[f"{path}.weight"] = contiguous(autotp_sizes(shape[1], tp, kv, path))
        elif sub:
            types[path] = "SubParamLinearLayer"
            shards.update({f"{path}.weight": 0, f"{path}.bias": 0})
            layouts[f"{path}.weight"] = layouts[f"{path}.bias"] = packed([shape[0] // sub[0]] * sub[0], tp, kv, path)
        else:
            types[path] = "LinearLayer"
            shards.update({f"{path}.weight": 0, f"{path}.bias": 0})
            layouts[f"{path}.weight"] = layouts[f"{path}.bias"] = contiguous(autotp_sizes(shape[0], tp, kv, path))
    return types, shards, layouts


class ZooPreset(ZooHead):
    name = "zoo_preset"
    feature = None
    axes = {**ZOO_AXES, "arch": tuple(PRESET_OF), "vocab_parallel_lm_head": ("false", "true")}
    defaults = {"vocab": zoo.VOCAB, "vocab_parallel_lm_head": "false"}
    description = ("A zoo architecture of an AutoTP preset family (llama, qwen2, phi3, mixtral, deepseek_v2, bloom) "
                   "through tensor_parallel.preset_model, its HF plan left in place (a partition_config wins over "
                   "it); vocab_parallel_lm_head true or false; claims from the preset's layer specs.")

    def tensor_parallel_config(self, values):
        return {"preset_model": PRESET_OF[values["arch"]],
                "vocab_parallel_lm_head": values["vocab_parallel_lm_head"] == "true"}

    def vocab_parallel(self, values):
        return values["vocab_parallel_lm_head"] == "true"

    def head_style(self, values, info):
        return None  # no preset spec names the head: it stays the user's nn.Linear

    def claims(self, values):
        info = self.info(values)
        layers = preset_layers(values["arch"], PRESET_OF[values["arch"]], values["tp"], info["kv"], info["shapes"])
        return self.head_claims(values, info, *layers)
