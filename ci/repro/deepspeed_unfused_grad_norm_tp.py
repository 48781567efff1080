"""DeepSpeed 0.19.8: with AutoTP and bf16/fp16 under ZeRO stage 0, the global gradient norm used for
clipping ignores the head shards held by tensor-parallel ranks > 0.

FP16_UnfusedOptimizer.step flattens each group's gradients (_flatten_dense_tensors) before
get_weight_norm(..., mpu). The flat tensor has no model-parallel attribute, so on every TP rank > 0
get_weight_norm's "avoid over-counting replicated tensors" filter skips all of it, sharded head
gradients included; the SUM all-reduce then adds only rank 0's gradients. The reported norm (and the
clip coefficient) is the norm of rank 0's gradients, not of the model's.

Run (CPU, about 20 s):  python ci/repro/deepspeed_unfused_grad_norm_tp.py
Exit status 1 when the engine's norm differs from the true norm (the bug), 0 when they agree.

Finding: findings/deepspeed_unfused_grad_norm_tp.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 35, 32


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny().to(torch.bfloat16)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 0}, "bf16": {"enabled": True}, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"proj\.weight$"], "partition_type": "skip"},
                  {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    engine.backward(engine(ids))
    # The true global norm: head shards summed over TP ranks, replicated parameters counted once.
    sharded = sum(p.grad.float().pow(2).sum() for n, p in model.named_parameters() if n.startswith("lm_head"))
    replicated = sum(p.grad.float().pow(2).sum() for n, p in model.named_parameters() if not n.startswith("lm_head"))
    total = sharded.clone()
    dist.all_reduce(total)
    true_norm = float((total + replicated).sqrt())
    rank0_only = float((sharded + replicated).sqrt())
    engine.step()
    if rank == 0:
        result.update(engine=float(engine.get_global_grad_norm()), true=true_norm, rank0_grads_only=rank0_only)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    print(f"engine.get_global_grad_norm() = {result['engine']:.6f}")
    print(f"true global gradient norm     = {result['true']:.6f}")
    print(f"norm of rank 0's grads only   = {result['rank0_grads_only']:.6f}")
    wrong = abs(result["engine"] - result["true"]) > 1e-2 * result["true"]
    print("MISMATCH: the clipping norm leaves out TP ranks > 0" if wrong else "norms agree")
    sys.exit(1 if wrong else 0)
