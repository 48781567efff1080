"""DeepSpeed 0.19.8: init_inference with tensor_parallel.tp_size smaller than the world crashes with an AutoTP assertion.

InferenceEngine._create_model_parallel_group (inference/engine.py:278-289) makes one TP group, new_group(range(tp_size)),
whatever the world size. On 4 ranks with tp_size 2 (two tp-2 copies of a model, the layout the training path builds as
groups [0, 1] and [2, 3]), ranks 2-3 are outside [0, 1]: their group size reads -1 and AutoTP asserts while converting
the head, "AutoTP shard sizes [] for layer 'lm_head' do not sum to the dimension size ... with tp_size=-1", which names
neither the group nor the world size. Nothing compares tp_size with the world before the model is converted: ranks 0-1
replace their model's lm_head in place (LmHeadLinearAllreduce over [0, 1]) and then wait in the engine's RNG broadcast
over the whole world (engine.py:179-182), which ranks 2-3 never join; they fail on the closed connection, and no rank
gets an engine. Expected: TP groups for every rank (each copy its head's halves, logits equal to
plain PyTorch) or a clear error on every rank before the model is touched.

Run (CPU, 4 processes, ~30 s):  python ci/repro/deepspeed_inference_tp_size_below_world.py
Exit status 1 while a rank fails with the AutoTP assertion (or any rank lacks a working tp-2 head), 0 once every rank
runs a tp-2 copy with PyTorch's logits, or every rank refuses the call with an error that is not that assertion.

Finding: findings/deepspeed_inference_tp_group.toml
"""
import copy
import datetime
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

WORLD, TP, VOCAB, HIDDEN = 4, 2, 34, 32


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    # A short collective timeout: a rank whose peer died reports it instead of waiting half an hour.
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(2)
    model = Tiny()
    plain = copy.deepcopy(model)
    try:
        engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": TP}, dtype=torch.float32,
                                          replace_with_kernel_inject=False, injection_policy={Tiny: ("proj",)})
        ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            error = float((engine(ids) - plain(ids)).abs().max())
    except Exception as exc:  # noqa: BLE001 - what the user sees is the result
        # What the refused call left in the user's model: its head converted or not.
        result[rank] = (f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]} (model.lm_head now "
                        f"{type(model.lm_head).__name__} {tuple(model.lm_head.weight.shape)})")
        return
    result[rank] = {"head": type(engine.module.lm_head).__name__, "shard": tuple(engine.module.lm_head.weight.shape),
                    "logits_error": error}


if __name__ == "__main__":
    results = run_ranks(rank_main, WORLD, env={"DS_ACCELERATOR": "cpu"}, init=False)
    print(f"init_inference(tensor_parallel={{'tp_size': {TP}}}) on {WORLD} ranks, a fresh process:")
    for rank in range(WORLD):
        print(f"  rank {rank}: {results.get(rank)}")
    working = all(isinstance(r, dict) and r["shard"] == (VOCAB, HIDDEN // TP) and r["logits_error"] < 1e-5
                  for r in results.values()) and len(results) == WORLD
    refused = len(results) == WORLD and all(isinstance(r, str) and "AutoTP shard sizes" not in r
                                            for r in results.values())
    if working or refused:
        print("every rank runs a tp-2 copy" if working else "every rank refuses the call")
        sys.exit(0)
    print("WRONG: tp_size below the world is neither sharded for every rank nor refused clearly on every rank")
    sys.exit(1)
