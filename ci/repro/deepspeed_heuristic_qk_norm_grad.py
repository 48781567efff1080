"""DeepSpeed 0.19.8: AutoTP's heuristic parser shards a Qwen3 attention's heads but leaves its q_norm/k_norm
weights replicated with no gradient all-reduce: each TP rank's gradient of them is its own heads' part only.

Qwen3's q_norm and k_norm (RMSNorm over head_dim) are applied to every head. With the model's HF plan the engine
marks them replicated_with_grad_allreduce (register_replicated_grad_hooks sums their gradient over the TP group);
a model without a plan reaches the heuristic path (engine.py: tp_parser + replace_transformer_layer), which shards
q/k/v and o_proj by heads and registers no such hook, so each rank's q_norm gradient misses the other ranks' heads.
No error; the replicas of q_norm then drift apart after the first step.

Run (CPU, 2 processes over gloo, about 30 s):  python ci/repro/deepspeed_heuristic_qk_norm_grad.py
Exit status 1 while a rank's q_norm gradient differs from the unsharded model's.
Finding: findings/deepspeed_heuristic_qk_norm_grad.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def build():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=8, attn_implementation="eager")
    config.base_model_tp_plan = None  # a model without a plan: the heuristic path
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.__dict__["_tp_plan"] = None
    type(model)._tp_plan = None
    return model


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = build()
    model(input_ids=ids, labels=ids).loss.backward()
    want = model.model.layers[0].self_attn.q_norm.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": TP}}  # no partition_config, no plan: the heuristic parser
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    got = model.model.layers[0].self_attn.q_norm.weight.grad
    result[rank] = {"q_proj": tuple(model.model.layers[0].self_attn.q_proj.weight.shape),
                    "max_diff": float((got - want).abs().max()), "scale": float(want.abs().max())}
    engine.destroy()


if __name__ == "__main__":
    ranks = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for rank, r in sorted(ranks.items()):
        print(f"rank {rank}: q_proj shard {r['q_proj']}, max |q_norm grad - unsharded| {r['max_diff']:.3e} "
              f"(unsharded max {r['scale']:.3e})")
    wrong = any(r["max_diff"] > 1e-6 * max(1.0, r["scale"]) for r in ranks.values())
    print("MISMATCH: the replicated q_norm's gradient is a partial one on each rank" if wrong
          else "q_norm gradient as the unsharded model's")
    sys.exit(1 if wrong else 0)
