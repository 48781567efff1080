"""DeepSpeed 0.19.8: an untied embedding sharded by a partition_config spec is left out of the clipping
norm on every tensor-parallel rank > 0.

AutoTP._slice_embedding (module_inject/auto_tp.py) rebuilds the spec'd embedding as a bare
nn.Embedding(V, H/P) holding the rank's hidden slice, and never marks its weight tensor_model_parallel
(module_inject/layers.py marks the LinearLayer / LinearAllreduce weights so). The global norm
(runtime/utils.py get_grad_norm / get_global_norm_of_tensors and the ZeRO optimizers) counts a
parameter that is not model-parallel on TP rank 0 only, to avoid over-counting a replicated tensor:
ranks > 0's embedding slices are dropped, the norm is too small and every clipped update too large.
No error or warning; fp32 as well as bf16, every ZeRO stage (found by parity explore --seed 8).

Run (CPU, about 30 s):  python ci/repro/deepspeed_embedding_spec_clip_norm.py
Exit status 1 when the engine's norm differs from the true norm (the bug), 0 when they agree.

Finding: findings/deepspeed_embedding_spec_bare_rebuild.toml
"""
import importlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32


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
    from deepspeed.utils import safe_get_full_grad

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  {"patterns": [r"embed_tokens\.weight$"], "partition_type": "row"},
                  {"patterns": [r"proj\.weight$"], "partition_type": "row"},
                  {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    engine.backward(engine(ids))
    # The true global norm: every TP shard summed over the TP ranks, the replicated proj.bias once.
    grads = {n: safe_get_full_grad(p).float() for n, p in engine.module.named_parameters()}
    sharded = sum(g.pow(2).sum() for n, g in grads.items() if n != "proj.bias")
    embedding = grads["embed_tokens.weight"].pow(2).sum()
    totals = torch.stack([sharded, embedding])
    dist.all_reduce(totals)
    replicated = grads["proj.bias"].pow(2).sum()
    true_norm = float((totals[0] + replicated).sqrt())
    rank0_embedding_only = float((totals[0] - totals[1] + embedding + replicated).sqrt()) if rank == 0 else None
    engine.step()
    if rank == 0:
        result.update(engine=float(engine.get_global_grad_norm()), true=true_norm,
                      rank0_embedding_only=rank0_embedding_only)


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    print(f"engine.get_global_grad_norm()                  = {result['engine']:.8f}")
    print(f"true global gradient norm                      = {result['true']:.8f}")
    print(f"the same with TP rank 0's embedding slice only = {result['rank0_embedding_only']:.8f}")
    wrong = abs(result["engine"] - result["true"]) > 1e-6 * result["true"]
    print("MISMATCH: the clipping norm leaves out the spec'd embedding's slices on TP ranks > 0" if wrong
          else "norms agree")
    sys.exit(1 if wrong else 0)
