"""DeepSpeed 0.19.8: deepspeed.zero.Init(dtype=torch.float32) gives bfloat16 parameters on an accelerator without fp16.

A user builds a big model under ZeRO 3's zero.Init and names the dtype it should hold, as its docstring offers
("dtype: Can be used to change the data type of the parameters"). Init._set_dtype (runtime/zero/
partition_parameters.py:409-410) reads an explicit dtype as

    self.dtype = dtype or torch.float16 if get_accelerator().is_fp16_supported() \
        else torch.bfloat16 if get_accelerator().is_bf16_supported else torch.float32

which Python groups as `(dtype or float16) if fp16_supported else (bfloat16 if <bound method> else float32)`:
on an accelerator that reports no fp16 (a CPU without oneDNN fp16) the dtype asked for is dropped, and the
bound method, never called, is always true. The model's float32 weights become bfloat16 without a word
(every weight rounded to bf16: a relative change of up to 0.0038 here), and so does the config path's fp32 training.
Without the dtype argument zero.Init takes the config's (float32 here), as transformers calls it.

Run (CPU, 1 process over gloo, about 15 s): python ci/repro/deepspeed_zero_init_dtype_ignored.py
Exit status 1 while the parameters are not the dtype asked for, 0 once they are.

Finding: findings/deepspeed_zero_init_dtype_ignored.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

CONFIG = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    pretrained = torch.nn.Linear(32, 34).state_dict()
    for label, kwargs in (("config only", {}), ("dtype=torch.float32", {"dtype": torch.float32})):
        with deepspeed.zero.Init(config_dict_or_path=CONFIG, **kwargs):
            model = torch.nn.Linear(32, 34)
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            model.load_state_dict(pretrained)
            weight = model.weight.detach().double()
            error = float(((weight - pretrained["weight"].double()).abs() / pretrained["weight"].double().abs()).max())
        result[label] = (str(model.weight.dtype), error)
    result["fp16_supported"] = get_accelerator().is_fp16_supported()


if __name__ == "__main__":
    result = run_ranks(rank_main, 1, env={"DS_ACCELERATOR": "cpu"}, init=False)
    print(f"accelerator reports fp16 support: {result.pop('fp16_supported')}")
    wrong = False
    for label, (dtype, error) in result.items():
        print(f"zero.Init({label}): weight {dtype}, largest relative change of the loaded float32 weights {error:.2g}")
        wrong |= dtype != "torch.float32"
    print("WRONG: zero.Init did not give the float32 parameters asked for" if wrong else "float32 as asked")
    sys.exit(1 if wrong else 0)
