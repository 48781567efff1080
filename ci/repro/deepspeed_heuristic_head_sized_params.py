"""DeepSpeed 0.19.8: AutoTP's heuristic parser shards attention heads but leaves the attention's head-sized
parameters that are no Linear whole: GraniteSWA's attention sinks and OLMoE's q/k norms crash the first forward.

The heuristic path (a model without a plan) replaces only the nn.Linear children of a block (AutoTP._replace_module):
q/k/v_proj are cut by heads, o_proj by rows, update_mp_params divides the head counts. A parameter sized by the heads
stays as it was: GraniteSWAAttention.sinks ([num_heads], one learned sink logit per head, which its HF plan shards
colwise) meets the local heads' scores; OLMoE's q_norm/k_norm (an RMSNorm over all heads' features, for which its
HF plan gathers q/k/v) meets the local q_proj/k_proj output. Both raise a size mismatch; initialize accepts them.

Run (CPU, 2 processes over gloo, about 20 s each):  python ci/repro/deepspeed_heuristic_head_sized_params.py [granite_swa | olmoe]
Exit status 1 while a model's TP-2 forward raises (or its logits differ from the unsharded model's).
Finding: findings/deepspeed_heuristic_head_sized_params.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2
CONFIGS = {  # tiny, 4 heads; olmoe with 4 small experts
    "granite_swa": dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4),
    "olmoe": dict(hidden_size=32, intermediate_size=32, num_attention_heads=4, num_key_value_heads=4,
                  num_experts=4, num_experts_per_tok=2),
}


def build(arch):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(arch, vocab_size=64, num_hidden_layers=1, pad_token_id=0, bos_token_id=1,
                                  eos_token_id=2, **CONFIGS[arch])
    config.base_model_tp_plan = None  # a model without a plan: the heuristic path
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.__dict__["_tp_plan"] = None
    type(model)._tp_plan = None
    return model


def rank_main(rank, result, arch):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = build(arch)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": TP}}  # no partition_config, no plan: the heuristic parser
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    try:
        with torch.no_grad():
            got = engine(input_ids=ids).logits
        result[rank] = {"error": None, "max_diff": float((got - want).abs().max())}
    except Exception as exc:  # noqa: BLE001 (what the rank raised is the finding)
        result[rank] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    engine.destroy()


if __name__ == "__main__":
    archs = sys.argv[1:] or list(CONFIGS)
    wrong = False
    for arch in archs:
        ranks = run_ranks(rank_main, TP, arch, env={"DS_ACCELERATOR": "cpu"}, init=False)
        for rank, r in sorted(ranks.items()):
            print(f"{arch} rank {rank}: " + (f"forward raised {r['error']}" if r["error"] else
                                             f"max |logits - unsharded| {r['max_diff']:.3e}"))
            wrong |= bool(r["error"]) or r["max_diff"] > 1e-5
    print("MISMATCH: a head-sized parameter left whole beside sharded heads" if wrong
          else "logits as the unsharded model's")
    sys.exit(1 if wrong else 0)
