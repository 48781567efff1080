"""DeepSpeed 0.19.8: partition_config `grad_allreduce` on a parameter whose gradient is already whole
multiplies that gradient by the tensor-parallel size, silently.

`grad_allreduce: true` on a skip spec (module_inject/autotp_config.py TPLayerSpec) makes
AutoTP.register_replicated_grad_hooks (module_inject/auto_tp.py) put a tensor hook on every matching
parameter that SUMS its gradient over the TP group. It is meant for a replicated parameter applied to
sharded activations (Qwen3's q_norm/k_norm), whose per-rank gradients are partial. Nothing checks that:
on a replicated Linear that reads the replicated hidden state (here `proj`, ahead of a gathered
column-parallel head, whose backward all-reduces the input gradient) every rank already holds the full
gradient, the sum is TP x it, and the optimizer applies it. Plain PyTorch (and the same engine without
the flag) gives the true gradient. No error or warning: the engine only logs that it registered the hook.

Run (CPU, 2 processes over gloo, about 20 s):  python ci/repro/deepspeed_grad_allreduce_replicated_grad.py
Exit status 1 while proj's gradient with grad_allreduce differs from the one without it, 0 once they agree.

Finding: findings/deepspeed_grad_allreduce_replicated_grad.toml
"""
import importlib
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN = 2, 34, 32


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def proj_grad(grad_allreduce: bool) -> torch.Tensor:
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    torch.manual_seed(0)
    model = Tiny()
    proj = {"patterns": [r"proj\.weight$"], "partition_type": "skip", "grad_allreduce": grad_allreduce}
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
              "tensor_parallel": {"autotp_size": TP, "partition_config": {"use_default_specs": False, "layer_specs": [
                  proj, {"patterns": [r"lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=0.05), config=config)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    engine.backward(engine(ids))
    grad = safe_get_full_grad(engine.module.proj.weight).clone()
    engine.destroy()
    return grad


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    plain, flagged = proj_grad(False), proj_grad(True)
    # The unsharded model in plain PyTorch, same weights and batch.
    torch.manual_seed(0)
    model = Tiny()
    model(torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))).backward()
    reference = model.proj.weight.grad
    result[rank] = (float((plain - reference).abs().max()), float((flagged - reference).abs().max()),
                    float(flagged.norm() / reference.norm()), float(reference.norm()))


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"}, init=False)
    wrong = False
    for rank, (plain, flagged, ratio, norm) in sorted(result.items()):
        print(f"rank {rank}: |proj.weight.grad| plain torch {norm:.6f}; max |engine - torch| without grad_allreduce "
              f"{plain:.2e}, with it {flagged:.2e}; |with| / |torch| = {ratio:.6f} (TP = {TP})")
        wrong |= flagged > 1e-5 * max(norm, 1.0)
    print(f"MISMATCH: grad_allreduce sums an already-whole gradient over the TP group ({TP}x)" if wrong
          else "gradients agree")
    sys.exit(1 if wrong else 0)
