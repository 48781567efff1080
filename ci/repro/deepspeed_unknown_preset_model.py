"""DeepSpeed 0.19.8: an unknown tensor_parallel.preset_model is accepted without a word.

``tensor_parallel.preset_model`` selects AutoTP's built-in layer specs (``AutoTPPresets``: llama, bloom, chatglm,
mixtral, deepseek_v2, qwen2, phi3). ``AutoTPPresets.get_preset`` (module_inject/autotp_config.py:558-572) returns
None for any other name, and ``get_partition_config_object`` (runtime/tensor_parallel/config.py:121-145) then
hands the engine no partition config at all: it takes AutoTP's heuristic parser, a different sharding source
from the one the user named, and says nothing. That includes "llama_gqa", a method AutoTPPresets defines but
get_preset does not list (it needs head counts), and any model type without a preset ("mistral"). AutoEP's
``expert_parallel.preset_model`` in the same release refuses the same mistake: ``ValueError: Unknown
preset_model 'llama_gqa'. Available presets: [...]``.

On this Llama-shaped model the heuristic happens to shard the blocks as the llama preset does, so the loss after a
step is plain torch's either way; the point is what the config says and what ran. On a model the heuristic cannot
place, the user gets the heuristic's error, which does not name the preset.

Run (CPU, about 35 s):
  python ci/repro/deepspeed_unknown_preset_model.py             # "mistral" and "llama_gqa" accepted; "llama" as named
Exit status 1 while an unknown preset_model is accepted, 0 once it is refused.

Finding: findings/deepspeed_unknown_preset_model.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 16, 8
PRESETS = ("llama", "mistral", "llama_gqa")


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))

    def forward(self, x):  # no softmax or heads: the parser reads names and shapes, not the attention's maths
        return self.o_proj(self.q_proj(x) * torch.sigmoid(self.k_proj(x)) + self.v_proj(x))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False), nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.down_proj = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        x = x + self.self_attn(x)
        return x + self.mlp(x)


class TinyLlamaModel(nn.Module):  # "...Model" and a ModuleList of blocks: what the heuristic parser looks for
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for block in self.layers:
            x = block(x)
        logits = self.lm_head(x)
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def batch():
    return torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))


def plain_losses():
    torch.manual_seed(0)
    model = TinyLlamaModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = model(batch())
    first.backward()
    opt.step()
    with torch.no_grad():
        return first.item(), model(batch()).item()


def rank_main(rank, result, preset):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TinyLlamaModel()
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
              "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 by default; plain torch does not clip
              "tensor_parallel": {"autotp_size": TP, "preset_model": preset}}
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    except ValueError as exc:
        result[rank] = f"refused: {str(exc).splitlines()[0][:120]}"
        return
    specs = engine._config.tensor_parallel_config.get_partition_config_object()
    first = engine(batch())
    engine.backward(first)
    engine.step()
    with torch.no_grad():
        second = engine(batch())
    o_proj = type(engine.module.layers[0].self_attn.o_proj).__name__
    source = "no partition config (the heuristic parser)" if specs is None else f"{len(specs.layer_specs)} preset specs"
    result[rank] = (f"accepted: {source}, layers.0.self_attn.o_proj a {o_proj}, loss {first.item():.6f} then "
                    f"{second.item():.6f}")


if __name__ == "__main__":
    from deepspeed.module_inject.auto_ep_presets.registry import get_preset as ep_get_preset

    expected = plain_losses()
    print(f"plain torch, one rank: loss {expected[0]:.6f} then {expected[1]:.6f}")
    accepted_unknown = False
    for preset in PRESETS:
        try:
            result = run_ranks(rank_main, TP, preset, env={"DS_ACCELERATOR": "cpu"}, timeout=120)
        except Exception as exc:  # a rank left in a collective by its peer's error
            print(f"preset_model {preset!r}: ranks did not finish: {type(exc).__name__}: {str(exc)[-400:]}")
            sys.exit(1)
        print(f"preset_model {preset!r}: rank 0 {result.get(0)}")
        accepted_unknown |= preset != "llama" and str(result.get(0)).startswith("accepted")
    try:
        ep_get_preset("llama_gqa")
    except ValueError as exc:
        print(f"expert_parallel.preset_model 'llama_gqa' (AutoEP's registry): ValueError: {exc}")
    print("an unknown preset_model was accepted without a word" if accepted_unknown else "unknown preset_model refused")
    sys.exit(1 if accepted_unknown else 0)
