"""DeepSpeed 0.19.8: `init_inference`'s tensor-parallel output head raises IndexError on a 2-D input.

`deepspeed.init_inference(model, tensor_parallel={"tp_size": P})` shards the output head as
`LmHeadLinearAllreduce`, whose forward cuts its hidden slice out of the input as
`input[:, :, offset:offset + size]` (`module_inject/layers.py:1738`): three indices, so a head input
of two dims ([tokens, hidden]: a model run on one unbatched sequence, or one that flattens its tokens
before the head) raises `IndexError: too many indices for tensor of dimension 2` on every rank. The
plain `nn.Linear` it replaced takes any number of leading dims, and so does the head with TP off. A
crash, not a silent error: the message names no head and no shape rule, after the model was
converted. The sliced form (`input[..., offset:offset + size]`) would take both.

Run (CPU, 2 ranks, about 15 s):  python ci/repro/deepspeed_inference_head_2d_input.py
Exit status 1 while the sharded head refuses the 2-D input that plain torch takes, 0 once it gives
plain torch's logits.

Finding: findings/deepspeed_inference_head_2d_input.toml
"""
import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, HIDDEN, SEQ = 2, 34, 32, 8


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.proj(self.embed_tokens(ids))))


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TinyLM()
    plain = copy.deepcopy(model)
    # The model has no transformer blocks for AutoTP's parser; a user policy naming it lets set_lm_head shard the head.
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": TP}, dtype=torch.float32,
                                      replace_with_kernel_inject=False, injection_policy={TinyLM: ("proj", )})
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))
    outcome = {"head": type(engine.module.lm_head).__name__}
    with torch.no_grad():
        batched = engine(ids)
        outcome["batched [1, seq]"] = f"max |logits - plain| {float((batched - plain(ids)).abs().max()):.1e}"
        want = plain(ids[0])
        try:
            got = engine(ids[0])
            outcome["unbatched [seq]"] = f"max |logits - plain| {float((got - want).abs().max()):.1e}"
        except IndexError as exc:
            outcome["unbatched [seq]"] = f"raised IndexError: {exc} (plain torch: logits {list(want.shape)})"
    result[rank] = outcome


if __name__ == "__main__":
    result = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    for rank in range(TP):
        for what, got in result[rank].items():
            print(f"rank {rank}, {what}: {got}")
    raised = any("raised" in got for outcome in result.values() for got in outcome.values())
    print(f"WRONG: the {result[0]['head']} head refuses a 2-D input that plain nn.Linear takes" if raised
          else "the sharded head takes a 2-D input")
    sys.exit(1 if raised else 0)
