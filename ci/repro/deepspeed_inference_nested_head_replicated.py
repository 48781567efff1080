"""DeepSpeed 0.19.8: `deepspeed.init_inference` with tensor parallelism leaves a nested output head
replicated, without a word.

After the layer policy runs, `replace_transformer_layer` hands the output head to AutoTP through
`set_lm_head` (`module_inject/replace_module.py`), which looks only at the top-level attributes
`lm_head`, `embed_out` and `language_model.lm_head`. A model whose head lives one level down (a wrapper
holding the causal LM as `.model`, as PEFT's `base_model.model.lm_head` does) is accepted with
`tensor_parallel={"tp_size": P}`, its transformer blocks are sharded, and its head stays a plain
`nn.Linear` holding the whole [V, H] weight on every rank: the logits are right, but the head's memory
and compute are not split, and nothing tells the user who asked for TP. The twin with the same
causal LM at the top level gets `LmHeadLinearAllreduce` holding [V, H/P].

Both models go through the automatic AutoTP path (no injection_policy): an HF-shaped `TinyModel` with
a `ModuleList` of blocks, so `AutoTP.tp_parser` accepts them.

Run (CPU, about 20 s):  python ci/repro/deepspeed_inference_nested_head_replicated.py
Exit status 1 while the nested head stays an unsharded nn.Linear, 0 once it is sharded like the
top-level one (or init_inference refuses the model).

Finding: findings/deepspeed_inference_nested_head_replicated.toml
"""
import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN, INTERMEDIATE = 2, 34, 32, 128  # 128: two whole grains of init_inference's default 64


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up_proj = torch.nn.Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = torch.nn.Linear(INTERMEDIATE, HIDDEN)

    def forward(self, h):
        return h + self.down_proj(torch.tanh(self.up_proj(h)))


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList([Block()])

    def forward(self, ids):
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h)
        return h


class TinyForCausalLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = TinyModel()
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.lm_head(self.model(ids))


class Wrapper(torch.nn.Module):
    """The same causal LM one level down: its head is at model.lm_head."""

    def __init__(self):
        super().__init__()
        self.model = TinyForCausalLM()

    def forward(self, ids):
        return self.model(ids)


def shard(rank, model):
    import deepspeed

    plain = copy.deepcopy(model)
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": TP}, dtype=torch.float32,
                                      replace_with_kernel_inject=False)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, want = engine(ids), plain(ids)
    lm = engine.module if isinstance(plain, TinyForCausalLM) else engine.module.model
    head, block = lm.lm_head, lm.model.layers[0]
    return (type(head).__name__, tuple(head.weight.shape), head.weight.numel() * head.weight.element_size(),
            f"{type(block.down_proj).__name__} {list(block.down_proj.weight.shape)}",
            float((logits - want).abs().max()))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    top = TinyForCausalLM()
    torch.manual_seed(0)
    nested = Wrapper()
    outcome = {"top-level lm_head": shard(rank, top)}
    try:
        outcome["nested model.lm_head"] = shard(rank, nested)
    except (ValueError, AssertionError, NotImplementedError) as exc:  # a refusal is a fix too
        outcome["nested model.lm_head"] = f"raised {type(exc).__name__}: {exc}"
    result[rank] = outcome


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    replicated = False
    for rank in range(TP):
        for where, got in result[rank].items():
            if isinstance(got, str):
                print(f"rank {rank}, {where}: init_inference {got}")
                continue
            kind, shape, nbytes, block, err = got
            print(f"rank {rank}, {where}: head {kind} {list(shape)} ({nbytes} bytes), block down_proj {block}, "
                  f"max |logits - plain| {err:.1e}")
            replicated |= where.startswith("nested") and kind == "Linear" and shape == (VOCAB, HIDDEN)
    print(f"WRONG: tensor_parallel tp_size={TP} accepted, blocks sharded, the nested head left whole on every rank"
          if replicated else "nested head sharded (or refused)")
    sys.exit(1 if replicated else 0)
