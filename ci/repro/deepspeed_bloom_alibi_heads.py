"""DeepSpeed 0.19.8: AutoTP shards BLOOM's attention heads but not its ALiBi slopes: with preset_model "bloom" every
rank adds the slopes of a model with n_head / tp heads (wrong logits, silently); the heuristic path crashes.

BloomModel builds the ALiBi bias from its own num_heads (_get_alibi_slopes(self.num_heads)); each attention adds it
to the scores of the heads it holds. Under preset_model the partition walk reaches BloomModel and update_mp_params
divides its num_heads by the TP size, so the bias holds the slopes of a smaller model (for 4 heads over 2 ranks, the
slopes of a 2-head model on both ranks) instead of each rank's own heads' slopes: logits off from the first forward,
no error. The heuristic parser walks only the blocks, leaves BloomModel.num_heads whole, and the full-head bias meets
the local heads' scores: a size mismatch.

Run (CPU, 2 processes over gloo, about 30 s):  python ci/repro/deepspeed_bloom_alibi_heads.py
Exit status 1 while the preset's TP-2 logits differ from the unsharded model's.
Finding: findings/deepspeed_bloom_alibi_heads.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def build():
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4, attn_implementation="eager")
    torch.manual_seed(0)
    return BloomForCausalLM(config).eval()


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = build()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": TP, "preset_model": "bloom"}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    with torch.no_grad():
        got = engine(input_ids=ids).logits
    result[rank] = {"num_heads": model.transformer.num_heads, "max_diff": float((got - want).abs().max())}
    engine.destroy()


if __name__ == "__main__":
    ranks = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for rank, r in sorted(ranks.items()):
        print(f"rank {rank}: BloomModel.num_heads {r['num_heads']} (model: 4), "
              f"max |logits - unsharded| {r['max_diff']:.3e}")
    wrong = any(r["max_diff"] > 1e-5 for r in ranks.values())
    print("MISMATCH: the ALiBi bias is not the rank's heads'" if wrong else "logits as the unsharded model")
    sys.exit(1 if wrong else 0)
