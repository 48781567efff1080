"""DeepSpeed 0.19.8: under `torch_autocast` (bf16), an AutoTP head with a bias returns float32 logits
where the nn.Linear it replaced returns bf16.

The engine runs forward under torch.autocast (runtime/torch_autocast.py autocast_if_enabled). nn.Linear
is one autocast op (F.linear, bias included): bf16 output. AutoTP's replacements (LinearLayer,
VocabParallelLinear, LinearAllreduce; module_inject/layers.py) compute torch.matmul (autocast: bf16) and
then add_bias(output, self.bias), an out-of-place `output + bias` with the float32 parameter, which
type-promotes to float32. So the head's output, the model's largest activation ([batch, seq, vocab]),
is float32: twice the memory, and a different dtype (and one rounding fewer) than the same model gives
without TP under the same autocast. The bf16 GEMM itself still ran.

Also printed, not judged here: which parameters init_autocast_params marked with `comm_dtype` (the
dtype ZeRO 1/2/3 reduce their gradients in). It runs after AutoTP replaced the head, and marks only
modules whose class is exactly one of LOWER_PRECISION_SAFE_MODULES, so the replaced head stays
unmarked (reduced in float32) while the replicated nn.Linear `proj` is marked bf16. Reducing those in
bf16 is DeepSpeed's documented intent for lower-precision-safe modules (DDP reduces float32).

Run (CPU, 2 processes over gloo, about 30 s):  python ci/repro/deepspeed_torch_autocast_tp_head_fp32.py
Exit status 1 while the TP head's logits dtype differs from plain torch's under the same autocast, 0
once they agree.

Finding: findings/deepspeed_torch_autocast_tp_head_fp32.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32
HEADS = {
    "vocab_parallel": {"vocab_parallel_lm_head": True, "partition_config": {"use_default_specs": False, "layer_specs": [
        {"patterns": [r"proj\.weight$"], "partition_type": "skip"}]}},
    "column_gathered": {"partition_config": {"use_default_specs": False, "layer_specs": [
        {"patterns": [r"proj\.weight$"], "partition_type": "skip"},
        {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}},
}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)
        self.loss_function = None  # the HF hook a vocabulary-parallel head needs (it installs its loss there)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


def engine_run(head: str):
    import deepspeed

    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
              "torch_autocast": {"enabled": True, "dtype": "bfloat16"},
              "tensor_parallel": {"autotp_size": TP, **HEADS[head]}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    logits = engine(torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1)))
    found = {"head": type(model.lm_head).__name__, "logits": str(logits.dtype),
             "comm_dtype marks": {n: str(getattr(p, "comm_dtype", "-")) for n, p in model.named_parameters()}}
    engine.destroy()
    return found


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result[rank] = {head: engine_run(head) for head in HEADS}


if __name__ == "__main__":
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = str(Tiny()(torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))).dtype)
    print(f"plain torch (no TP), same autocast: logits {plain}")
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    wrong = False
    for head, found in result[0].items():
        print(f"{head}: lm_head is {found['head']}, logits {found['logits']}; comm_dtype marks {found['comm_dtype marks']}")
        wrong |= found["logits"] != plain
    print("DIFFERENT: the AutoTP head's logits are not the dtype nn.Linear gives under the same autocast" if wrong
          else "same logits dtype")
    sys.exit(1 if wrong else 0)
