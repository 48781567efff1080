"""DeepSpeed 0.19.8: `torch_autocast.lower_precision_safe_modules` naming AutoTP's `LinearLayer` leaves a
`VocabParallelLinear` head, which is a LinearLayer (its subclass), out: ZeRO reduces its gradient in float32.

The option is documented as "the list of modules that will be downcasted for all-reduce (reduce-scatter) and
all-gather (ZeRO3)" (DeepSpeed's training docs, "Torch AMP"), with module names such as "torch.nn.Linear"; nothing
says a module must be of exactly the named class (the same page's ZeRO leaf modules match "by class or subclass").
init_autocast_params (runtime/torch_autocast.py) marks a module's parameters with `comm_dtype` only where
`module.__class__ in lower_precision_safe_module_classes`. AutoTP has already replaced the head when it runs
(engine.py:596 before :670), and with vocab_parallel_lm_head the head is a VocabParallelLinear, a subclass of
LinearLayer (module_inject/layers.py). A user who names LinearLayer, to have every column-parallel layer reduced in
bf16, gets the head's weight unmarked: ZeRO 1/2 put it in the float32 bucket (get_comm_dtype falls back to the
parameter's dtype), ZeRO 3 also gathers it in float32. No error or warning. Naming VocabParallelLinear itself marks it.

Run (CPU, 2 processes over gloo, about 15 s):  python ci/repro/deepspeed_torch_autocast_modules_exact_class.py
Exit status 1 while naming LinearLayer leaves an instance of it (the VocabParallelLinear head) unmarked, 0 once
the head is marked.

Finding: findings/deepspeed_torch_autocast_modules_exact_class.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32
LISTS = {
    "default (left out)": None,
    "names VocabParallelLinear": ["torch.nn.modules.linear.Linear", "deepspeed.module_inject.layers.VocabParallelLinear"],
    "names LinearLayer": ["torch.nn.modules.linear.Linear", "deepspeed.module_inject.layers.LinearLayer"],
}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.loss_function = None  # the HF hook a vocabulary-parallel head needs (it installs its loss there)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


def engine_run(modules):
    import deepspeed
    from deepspeed.module_inject.layers import LinearLayer
    from deepspeed.runtime.torch_autocast import get_comm_dtype

    torch.manual_seed(0)
    model = Tiny()
    autocast = {"enabled": True, "dtype": "bfloat16"}
    if modules is not None:
        autocast["lower_precision_safe_modules"] = modules
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "torch_autocast": autocast,
              "tensor_parallel": {"autotp_size": TP, "vocab_parallel_lm_head": True, "partition_config": {
                  "use_default_specs": False,
                  "layer_specs": [{"patterns": [r"proj\.weight$"], "partition_type": "skip"}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    head = engine.module.lm_head
    found = {"head": type(head).__name__, "is a LinearLayer": isinstance(head, LinearLayer),
             "head reduced in": str(get_comm_dtype(head.weight)),
             "proj reduced in": str(get_comm_dtype(engine.module.proj.weight)),
             "ZeRO buckets": sorted(str(d) for d in engine.optimizer.ipg_buckets)}
    engine.destroy()
    return found


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result[rank] = {name: engine_run(modules) for name, modules in LISTS.items()}


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    for name, found in result[0].items():
        print(f"lower_precision_safe_modules {name}: {found}")
    base = result[0]["names LinearLayer"]
    wrong = base["is a LinearLayer"] and base["head reduced in"] != "torch.bfloat16"
    print("DIFFERENT: LinearLayer is named and the head, a LinearLayer, is reduced in float32" if wrong
          else "the head is reduced in the autocast dtype")
    sys.exit(1 if wrong else 0)
