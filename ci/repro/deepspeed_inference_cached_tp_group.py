"""DeepSpeed 0.19.8: a second deepspeed.init_inference in one process ignores its tensor_parallel.tp_size.

InferenceEngine._create_model_parallel_group (inference/engine.py:278-289) makes the TP group once,
new_group(range(tp_size)), and caches it on the class (InferenceEngine.inference_mp_group); every later engine in the
process takes the cached group whatever its own tp_size. A user who loads a second model (a notebook, a server swapping
models) with tp_size 2 after one with tp_size 4, on 4 ranks, gets no error and no warning: the head is split in 4
(LmHeadLinearAllreduce weight [V, H/4] on every rank, not [V, H/2]) and the partial logits are all-reduced over all 4
ranks, while the engine's config still says tp_size 2. With one input on every rank the logits are right; ranks 2-3 fed
another input than ranks 0-1 (two tp-2 copies, as tp_size 2 on 4 ranks reads) are summed into ranks 0-1's logits.
The same call in a fresh process fails instead: ranks 2-3 are outside new_group([0, 1]) and AutoTP asserts
("AutoTP shard sizes [] ... with tp_size=-1"), an error that names neither the group nor the world size.

Run (CPU, 4 processes twice, about 3 minutes: the fresh run waits for its lost peers):  python ci/repro/deepspeed_inference_cached_tp_group.py
Exit status 1 while the second engine is sharded over the first one's group, 0 once it uses tp_size's (or refuses).

Finding: findings/deepspeed_inference_tp_group.toml
"""
import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

WORLD, FIRST_TP, SECOND_TP, VOCAB, HIDDEN = 4, 4, 2, 34, 32


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


def engine_for(model, tp):
    import deepspeed

    return deepspeed.init_inference(model, tensor_parallel={"tp_size": tp}, dtype=torch.float32,
                                    replace_with_kernel_inject=False, injection_policy={Tiny: ("proj",)})


def rank_main(rank, result, first_tp):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.distributed as dist
    from deepspeed.inference.engine import InferenceEngine

    deepspeed.init_distributed(dist_backend="gloo")
    if first_tp:
        torch.manual_seed(1)
        engine_for(Tiny(), first_tp)  # the user's first model
    torch.manual_seed(2)
    model = Tiny()
    plain = copy.deepcopy(model)
    try:
        engine = engine_for(model, SECOND_TP)
    except Exception as error:  # noqa: BLE001 - what the user sees is the result
        result[rank] = f"{type(error).__name__}: {error}"
        return
    same = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    # two tp-2 copies, each its own input (ranks 0-1 one, ranks 2-3 another)
    own = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(rank // SECOND_TP))
    with torch.no_grad():
        same_error = float((engine(same) - plain(same)).abs().max())
        own_error = float((engine(own) - plain(own)).abs().max())
    result[rank] = {"config_tp_size": engine._config.tensor_parallel.tp_size,
                    "group_size": dist.get_world_size(InferenceEngine.inference_mp_group),
                    "head_shard": tuple(model.lm_head.weight.shape), "same_input_error": same_error,
                    "own_input_error": own_error}


if __name__ == "__main__":
    env = {"DS_ACCELERATOR": "cpu"}
    fresh = run_ranks(rank_main, WORLD, 0, env=env, init=False)
    print(f"fresh process, init_inference(tp_size={SECOND_TP}) on {WORLD} ranks:")
    for rank in range(WORLD):
        print(f"  rank {rank}: {str(fresh[rank])[:200]}")
    second = run_ranks(rank_main, WORLD, FIRST_TP, env=env, init=False)
    print(f"after init_inference(tp_size={FIRST_TP}), init_inference(tp_size={SECOND_TP}) on {WORLD} ranks:")
    wrong = False
    for rank in range(WORLD):
        r = second[rank]
        if isinstance(r, str):
            print(f"  rank {rank}: refused: {r[:200]}")
            continue
        print(f"  rank {rank}: config tp_size {r['config_tp_size']}, TP group of {r['group_size']} ranks, head shard "
              f"{r['head_shard']} (tp_size {SECOND_TP}'s: {(VOCAB, HIDDEN // SECOND_TP)}); max |logits - PyTorch| "
              f"{r['same_input_error']:.2e} with one input on every rank, {r['own_input_error']:.2e} with each tp-2 "
              f"copy's own input")
        wrong = wrong or r["group_size"] != SECOND_TP or r["head_shard"] != (VOCAB, HIDDEN // SECOND_TP)
    print("WRONG: the second engine runs on the first engine's TP group, its tp_size ignored" if wrong
          else "the second engine uses its own tp_size")
    sys.exit(1 if wrong else 0)
