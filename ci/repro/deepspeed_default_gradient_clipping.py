"""DeepSpeed 0.19.8: a config without gradient_clipping clips at 1.0; plain torch does not clip.

``GRADIENT_CLIPPING_DEFAULT`` (runtime/constants.py:203) is 1.0 since DeepSpeed PR #8068 ("Default gradient_clipping to
1.0", June 2026: "configs that omit gradient_clipping run unclipped ... this avoids silently-unclipped runs"), an
intended change of default. A user who moves a plain-PyTorch training loop (no clip_grad_norm_) to DeepSpeed and
writes no gradient_clipping gets every step whose global gradient norm exceeds 1 scaled down to norm 1, without a
word; an explicit ``"gradient_clipping": 0.0`` restores torch's step. Under tensor parallelism the default also puts
every such user on DeepSpeed's TP clipping-norm paths (the unfused bf16/fp16 ZeRO 0 norm is a known divergence,
docs/findings.md#deepspeed_unfused_grad_norm_tp).

Run (CPU, one process, about 10 s):
  python ci/repro/deepspeed_default_gradient_clipping.py
Exit status 1 while the config without the key clips, 0 once it trains as plain torch does.

Finding: findings/deepspeed_default_gradient_clipping.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

VOCAB, HIDDEN, LR = 16, 8, 0.01


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        logits = self.lm_head(torch.tanh(self.embed_tokens(ids)))
        # A summed loss (as over a batch's tokens): its gradient norm is above 1 at the first step
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1),
                                                 reduction="sum")


def batch():
    return torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(1))


def plain_step():
    """Plain torch: the user's loop, no clip_grad_norm_. Returns the head's update and the gradient norm."""
    torch.manual_seed(0)
    model = Tiny()
    before = model.lm_head.weight.detach().clone()
    model(batch()).backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return (model.lm_head.weight.detach() - before), norm


def rank_main(rank, result, config_clip):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Tiny()
    before = model.lm_head.weight.detach().clone()
    config = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**9,
              **({} if config_clip is None else {"gradient_clipping": config_clip})}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=LR), config=config)
    engine.backward(engine(batch()))
    engine.step()
    result[rank] = (float(engine.gradient_clipping()), (engine.module.lm_head.weight.detach() - before).clone())


if __name__ == "__main__":
    torch_update, norm = plain_step()
    print(f"plain torch: gradient norm {norm:.4f}, no clipping")
    clipped = False
    for config_clip in (None, 0.0):
        result = run_ranks(rank_main, 1, config_clip, env={"DS_ACCELERATOR": "cpu"}, timeout=120)
        clip, update = result[0]
        ratio = (update.norm() / torch_update.norm()).item()
        written = "left out" if config_clip is None else f"{config_clip}"
        print(f"DeepSpeed, gradient_clipping {written}: the engine clips at {clip}, lm_head's update {ratio:.4f} x "
              f"torch's" + (f" (1 / norm = {1 / norm:.4f})" if config_clip is None else ""))
        clipped |= config_clip is None and abs(ratio - 1) > 1e-4
    print("a config without gradient_clipping clips the step" if clipped else "the default trains as torch does")
    sys.exit(1 if clipped else 0)
