"""DeepSpeed 0.19.8: AutoTP gives a multi-query Falcon's second TP rank empty attention shards, and its forward
crashes.

Falcon with multi_query (config.num_kv_heads 1) has one key/value head. tp_shard.get_shard_size splits a non-MLP
dimension by whole kv heads when it divides by their count: with one kv head TP rank 0 gets every feature of
query_key_value (the fused q/k/v) and of dense, TP rank 1 none, and update_mp_params sets rank 1's num_heads to 0.
FalconAttention views its fused output as [batch, seq, num_heads + 2, head_dim] (one shared k and v head): rank 1's
zero-element output cannot be viewed so, and rank 1 raises in the first forward while rank 0 waits in dense's
all-reduce. initialize accepts the split. Falcon has no HF plan, so its plan path is this one.

Run (CPU, 2 processes over gloo, about 20 s):  python ci/repro/deepspeed_falcon_mqa_empty_shard.py
Exit status 1 while a rank's forward raises (or its logits differ from the unsharded model's).
Finding: findings/deepspeed_autotp_empty_shard_crashes.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def build():
    from transformers import FalconConfig, FalconForCausalLM

    config = FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_kv_heads=1,
                          multi_query=True, new_decoder_architecture=False, attn_implementation="eager",
                          bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return FalconForCausalLM(config)


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    model = build()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": TP}}  # no plan: the heuristic parser
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    qkv = tuple(model.transformer.h[0].self_attention.query_key_value.weight.shape)
    try:
        with torch.no_grad():
            got = engine(input_ids=ids).logits
        result[rank] = {"qkv": qkv, "error": None, "max_diff": float((got - want).abs().max())}
    except Exception as exc:  # noqa: BLE001 (what the rank raised is the finding)
        result[rank] = {"qkv": qkv, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    engine.destroy()


if __name__ == "__main__":
    ranks = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for rank, r in sorted(ranks.items()):
        print(f"rank {rank}: query_key_value shard {r['qkv']}, " + (
            f"forward raised {r['error']}" if r["error"] else f"max |logits - unsharded| {r['max_diff']:.3e}"))
    wrong = any(r["error"] or r["max_diff"] > 1e-5 for r in ranks.values())
    print("MISMATCH: an empty attention shard breaks Falcon's multi-query forward" if wrong
          else "logits as the unsharded model's")
    sys.exit(1 if wrong else 0)
