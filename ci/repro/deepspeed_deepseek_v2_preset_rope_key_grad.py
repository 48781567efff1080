"""DeepSpeed 0.19.8: preset_model "deepseek_v2" leaves MLA's kv_a_proj_with_mqa replicated while its rope key
part feeds every (sharded) head, and nothing all-reduces that part's gradient: the gradients of kv_a_proj_with_mqa
and of everything below it (the embedding) are wrong on every rank, silently.

AutoTPPresets.deepseek_v2 skips q_a_proj and kv_a_proj_with_mqa and cuts q_b_proj / kv_b_proj by columns and o_proj
by rows. kv_a_proj_with_mqa's output is split into the compressed kv (kv_a_layernorm -> kv_b_proj, a column layer
whose backward all-reduces its input gradient) and k_pe, the single rope key every head shares
(modeling_deepseek_v2.py). Each rank's attention holds only its heads, so k_pe's gradient on a rank is its heads'
part, and no layer sums it over the TP group.

Run (CPU, 2 processes over gloo, about 40 s):  python ci/repro/deepspeed_deepseek_v2_preset_rope_key_grad.py
Exit status 1 while a rank's kv_a_proj_with_mqa gradient differs from the unsharded model's.
Finding: findings/deepspeed_deepseek_v2_preset_rope_key_grad.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def build():
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = DeepseekV2Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                              num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
                              q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                              n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
                              attn_implementation="eager")
    torch.manual_seed(0)
    return DeepseekV2ForCausalLM(config)


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = build()
    model(input_ids=ids, labels=ids).loss.backward()
    want = model.model.layers[0].self_attn.kv_a_proj_with_mqa.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": TP, "preset_model": "deepseek_v2"}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    got = model.model.layers[0].self_attn.kv_a_proj_with_mqa.weight.grad
    rank_rows = 16  # kv_lora_rank: the compressed kv rows; the rest are k_pe's
    result[rank] = {"max_diff": float((got - want).abs().max()), "scale": float(want.abs().max()),
                    "kv_diff": float((got - want)[:rank_rows].abs().max()),
                    "rope_diff": float((got - want)[rank_rows:].abs().max())}
    engine.destroy()


if __name__ == "__main__":
    ranks = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for rank, r in sorted(ranks.items()):
        print(f"rank {rank}: max |kv_a_proj_with_mqa grad - unsharded| {r['max_diff']:.3e} "
              f"(unsharded max {r['scale']:.3e}): compressed-kv rows {r['kv_diff']:.3e}, k_pe rows {r['rope_diff']:.3e}")
    wrong = any(r["max_diff"] > 1e-6 * max(1.0, r["scale"]) for r in ranks.values())
    print("MISMATCH: the rope key's gradient is a partial one on each rank" if wrong
          else "kv_a_proj_with_mqa gradient as the unsharded model's")
    sys.exit(1 if wrong else 0)
