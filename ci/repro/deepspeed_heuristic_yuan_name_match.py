"""DeepSpeed 0.19.8: AutoTP's heuristic parser gives HunYuan-Dense's attention Yuan2's shared-QK layers, because
"Yuan" is a substring of its class names; the logits are wrong, silently.

AutoTP._replace (module_inject/auto_tp.py:430-436) routes every v_proj to Yuan_LinearLayer and every o_proj to
Yuan_LinearAllreduce when 'Yuan' in str(self.module), the repr of the whole model, which names
HunYuanDenseV1DecoderLayer, HunYuanDenseV1Attention, ... Those layers cut the value heads Yuan2's way
(fusedqkv_utils.shared_qk_value_head_ids: rank 0 takes heads 0 and 2 of 4), while q_proj and k_proj are cut
contiguously (rank 0: heads 0 and 1): each rank attends with one head's query and key and another head's value, and
o_proj reads them as that other head's. A HunYuan-Dense without its plan reaches this path; with the plan it passes.

Run (CPU, 2 processes over gloo, about 20 s):  python ci/repro/deepspeed_heuristic_yuan_name_match.py
Exit status 1 while v_proj is a Yuan layer and a rank's logits differ from the unsharded model's.
Finding: findings/deepspeed_heuristic_yuan_name_match.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP = 2


def build():
    from transformers import HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM

    config = HunYuanDenseV1Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                                  attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config.base_model_tp_plan = None  # a model without a plan: the heuristic path
    torch.manual_seed(0)
    model = HunYuanDenseV1ForCausalLM(config)
    model.__dict__["_tp_plan"] = None
    type(model)._tp_plan = None
    return model


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = build()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": TP}}  # no partition_config, no plan: the heuristic parser
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    with torch.no_grad():
        got = engine(input_ids=ids).logits
    result[rank] = {"v_proj": type(model.model.layers[0].self_attn.v_proj).__name__,
                    "max_diff": float((got - want).abs().max()), "scale": float(want.abs().max())}
    engine.destroy()


if __name__ == "__main__":
    ranks = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for rank, r in sorted(ranks.items()):
        print(f"rank {rank}: v_proj is {r['v_proj']}, max |logits - unsharded| {r['max_diff']:.3e} "
              f"(unsharded max {r['scale']:.3e})")
    wrong = any(r["max_diff"] > 1e-5 * max(1.0, r["scale"]) for r in ranks.values())
    print("MISMATCH: Yuan's value-head layout beside contiguous q/k heads" if wrong
          else "logits as the unsharded model's")
    sys.exit(1 if wrong else 0)
