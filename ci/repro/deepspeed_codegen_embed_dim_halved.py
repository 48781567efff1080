"""DeepSpeed 0.19.8: AutoTP training a transformers CodeGenForCausalLM through its own HF tp_plan gives wrong logits
from the first forward, silently.

CodeGen's plan (transformers 5.24) shards the fused ``attn.qkv_proj`` colwise and ``attn.out_proj`` rowwise. AutoTP
shards both weights correctly (each rank holds whole (q, v, k) groups of mp_num = 4), and then update_mp_params
(module_inject/auto_tp.py:986-998) divides every attribute named embed_dim, num_attention_heads, ... of the
attention module by the TP size. CodeGenAttention.forward cuts its qkv output with
``local_dim = self.embed_dim // self.mp_num`` (modeling_codegen.py:137): with embed_dim halved each rank splits its
own features at half the group width, so query, value and key are mixed on every rank. No error is raised.

Run (CPU, 2 processes over gloo, about 30 s):  python ci/repro/deepspeed_codegen_embed_dim_halved.py
Exit status 1 while the TP-2 logits differ from the unsharded model's (or the attention's embed_dim was changed).
Finding: findings/deepspeed_codegen_embed_dim_halved.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def build():
    from transformers import CodeGenConfig, CodeGenForCausalLM

    config = CodeGenConfig(vocab_size=64, n_embd=32, n_head=4, n_layer=1, rotary_dim=4, n_positions=64, n_ctx=64,
                           attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return CodeGenForCausalLM(config).eval()


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = build()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": TP}}  # no partition_config: the model's HF tp_plan
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    with torch.no_grad():
        got = engine(input_ids=ids).logits
    attn = model.transformer.h[0].attn
    result[rank] = {"embed_dim": attn.embed_dim, "qkv_rows": tuple(attn.qkv_proj.weight.shape),
                    "max_diff": float((got - want).abs().max())}
    engine.destroy()


if __name__ == "__main__":
    ranks = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for rank, r in sorted(ranks.items()):
        print(f"rank {rank}: qkv_proj shard {r['qkv_rows']}, attn.embed_dim {r['embed_dim']} (model: 32), "
              f"max |logits - unsharded| {r['max_diff']:.3e}")
    wrong = any(r["max_diff"] > 1e-5 or r["embed_dim"] != 32 for r in ranks.values())
    print("MISMATCH: AutoTP changed CodeGen's embed_dim and its logits" if wrong else "logits as the unsharded model")
    sys.exit(1 if wrong else 0)
