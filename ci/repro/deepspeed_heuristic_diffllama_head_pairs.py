"""DeepSpeed 0.19.8: AutoTP's heuristic parser shards DiffLlama's attention by contiguous heads, which breaks the head
pairs of its differential attention: wrong logits at TP 2 (no error), a crash at TP 3.

DiffLlamaAttention chunks the value heads, and then the attention output, into two halves over the head axis and
pairs head i with head i + heads/2 (transformers modeling_diffllama.py: torch.chunk(value_states, 2, dim=1),
torch.chunk(attn_output, 2, dim=2)). A DiffLlama without its plan (the plan shards only the embedding) takes the
heuristic path, which cuts q/k/v_proj by whole heads and o_proj by rows (tp_shard.get_shard_size, kv-head rule):
rank 0 holds heads 0-1 of 4 and pairs them with each other instead of (0, 2) and (1, 3). At TP 3 (heads 2/1/1) a
rank with one head cannot chunk it into two and its forward raises.

Run (CPU, 2 or 3 processes over gloo, about 20 s):  python ci/repro/deepspeed_heuristic_diffllama_head_pairs.py [--tp 3]
Exit status 1 while a rank's logits differ from the unsharded model's (or its forward raises).
Finding: findings/deepspeed_heuristic_diffllama_head_pairs.toml
"""
import argparse
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402


def build():
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    config = DiffLlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=4, attn_implementation="eager")
    config.base_model_tp_plan = None  # a model without a plan: the heuristic path
    torch.manual_seed(0)
    model = DiffLlamaForCausalLM(config)
    model.__dict__["_tp_plan"] = None
    type(model)._tp_plan = None
    return model


def rank_main(rank, result, tp):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = build()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": tp}}  # no partition_config, no plan: the heuristic parser
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    q_rows = tuple(model.model.layers[0].self_attn.q_proj.weight.shape)
    try:
        with torch.no_grad():
            got = engine(input_ids=ids).logits
        result[rank] = {"q_proj": q_rows, "error": None, "max_diff": float((got - want).abs().max()),
                        "scale": float(want.abs().max())}
    except Exception as exc:  # noqa: BLE001 (what the rank raised is the finding)
        result[rank] = {"q_proj": q_rows, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    engine.destroy()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    tp = parser.parse_args().tp
    ranks = run_ranks(rank_main, tp, tp, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for rank, r in sorted(ranks.items()):
        print(f"rank {rank}: q_proj shard {r['q_proj']}, " + (f"forward raised {r['error']}" if r["error"] else
              f"max |logits - unsharded| {r['max_diff']:.3e} (unsharded max {r['scale']:.3e})"))
    wrong = any(r["error"] or r["max_diff"] > 1e-5 * max(1.0, r["scale"]) for r in ranks.values())
    print("MISMATCH: DiffLlama's head pairs are broken by the heuristic's head split" if wrong
          else "logits as the unsharded model's")
    sys.exit(1 if wrong else 0)
