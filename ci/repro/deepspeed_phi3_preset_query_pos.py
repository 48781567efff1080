"""DeepSpeed 0.19.8: tensor_parallel.preset_model "phi3" on a transformers 5.24 Phi3ForCausalLM crashes the first
forward.

The phi3 preset (autotp_config.AutoTPPresets.phi3) cuts the fused qkv_proj as three equal sub-parameters and o_proj by
rows; update_mp_params then divides the attention's num_key_value_heads by the TP size. Phi3Attention.forward takes
query_pos = self.config.num_attention_heads * self.head_dim from the (unchanged) config, so on each rank it reads the
local qkv output with the full model's query width (its query and key blocks read as queries, its value block as keys), and eager attention raises a
size mismatch. initialize accepts the preset without a word.

Run (CPU, 2 processes over gloo, about 30 s):  python ci/repro/deepspeed_phi3_preset_query_pos.py
Exit status 1 while the TP-2 forward raises (or its logits differ from the unsharded model's).
Finding: findings/deepspeed_phi3_preset_query_pos.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def build():
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=4, attn_implementation="eager",
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return Phi3ForCausalLM(config).eval()


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = build()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": TP, "preset_model": "phi3"}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    try:
        with torch.no_grad():
            got = engine(input_ids=ids).logits
        result[rank] = {"error": None, "max_diff": float((got - want).abs().max())}
    except RuntimeError as exc:
        result[rank] = {"error": str(exc).splitlines()[0], "max_diff": None}
    engine.destroy()


if __name__ == "__main__":
    ranks = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for rank, r in sorted(ranks.items()):
        print(f"rank {rank}: " + (f"forward raised {r['error']}" if r["error"] else
                                  f"max |logits - unsharded| {r['max_diff']:.3e}"))
    wrong = any(r["error"] or r["max_diff"] > 1e-5 for r in ranks.values())
    print("MISMATCH: the phi3 preset breaks Phi3's forward" if wrong else "logits as the unsharded model")
    sys.exit(1 if wrong else 0)
