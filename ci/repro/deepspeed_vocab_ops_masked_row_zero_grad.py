"""DeepSpeed 0.19.8: the vocabulary-parallel RL ops give a row of all -inf logits a zero gradient; torch gives nan.

A row whose logits are all -inf (a fully masked position) has no softmax. Plain torch on the full logits
(`log_softmax(logits).gather(-1, index)` for log-probabilities; `-(p * log p).sum(-1)` with p, log p from
`log_softmax` for the entropy) gives nan for its value and nan for its logits' gradient, which then reaches
every parameter upstream of the logits. `deepspeed.sequence.vocab_parallel_ops` documents the other choice
("entropy and KL return NaN for it, but its logits get zero gradient so that callers can mask such rows"):
`_undefined_rows` zeroes the row's gradient in `vocab_parallel_logprobs` and `vocab_parallel_entropy`
(`vocab_parallel_ops.py:91-93`), and a logprob whose id is ignored is 0 there as in torch. The values agree
(nan, or 0 for an ignored id); only the gradient differs. An intended difference, kept visible as a known
divergence. `vocab_parallel_kl_div` does the same for a row all -inf in the student, the teacher or both
(`vocab_parallel_ops.py:223-238`): the KL nan as torch's `F.kl_div(log_softmax(s), log_softmax(t),
log_target=True)`, both inputs' gradients 0 on that row where torch's are nan. `vocab_parallel_cross_entropy`
does not do this: its gradient at such a row is nan, as torch's F.cross_entropy.

Run (CPU, 2 ranks, about 15 s):  python ci/repro/deepspeed_vocab_ops_masked_row_zero_grad.py
Exit status 1 while an op's gradient at an all -inf row differs from torch's (0 against nan), 0 once they agree.

Finding: findings/deepspeed_vocab_ops_masked_row_zero_grad.toml
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ci/repro is no package: _ranks.py lies beside
from _ranks import run_ranks  # noqa: E402

TP, VOCAB, TOKENS, MASKED = 2, 10, 4, 1  # row MASKED is all -inf; vocabulary 10 over 2 ranks, 5 each
OPS = ("logprobs", "entropy", "cross_entropy", "kl_student_row", "kl_teacher_row")


def inputs():
    logits = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(0))
    logits[MASKED] = float("-inf")
    return logits, torch.tensor([3, 7, 9, 0])


def kl_pair(op):
    """(student, teacher) for the KL: the logits above as the one whose row MASKED is all -inf, a finite other."""
    logits, _ = inputs()
    other = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(1))
    return (logits, other) if op == "kl_student_row" else (other, logits)


def torch_side():
    """What a user without TP computes on the full logits."""
    logits, target = inputs()
    out = {}
    for op in OPS:
        if op.startswith("kl_"):
            s, t = (x.clone().requires_grad_(True) for x in kl_pair(op))
            value = torch.nn.functional.kl_div(torch.log_softmax(s, -1), torch.log_softmax(t, -1), log_target=True,
                                               reduction="none").sum(-1)
            value.sum().backward()
            out[op] = (value.detach(), s.grad if op == "kl_student_row" else t.grad)
            continue
        x = logits.clone().requires_grad_(True)
        log_p = torch.log_softmax(x, dim=-1)
        if op == "logprobs":
            value = log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        elif op == "entropy":
            value = -(log_p.exp() * log_p).sum(-1)
        else:
            value = torch.nn.functional.cross_entropy(x, target, reduction="none")
        value.sum().backward()
        out[op] = (value.detach(), x.grad)
    return out


def rank_main(rank, result):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a 60 s JIT build
    import deepspeed
    import torch.distributed as dist
    from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy
    from deepspeed.sequence.vocab_parallel_ops import vocab_parallel_entropy, vocab_parallel_kl_div, vocab_parallel_logprobs

    deepspeed.init_distributed(dist_backend="gloo")
    logits, target = inputs()
    part = slice(rank * VOCAB // TP, (rank + 1) * VOCAB // TP)
    out = {}
    for op in OPS:
        if op.startswith("kl_"):
            s, t = (x[:, part].clone().requires_grad_(True) for x in kl_pair(op))
            value = vocab_parallel_kl_div(s, t, tp_group=dist.group.WORLD)
            value.sum().backward()
            out[op] = (value.detach(), s.grad if op == "kl_student_row" else t.grad)
            continue
        local = logits[:, part].clone().requires_grad_(True)
        if op == "logprobs":
            value = vocab_parallel_logprobs(local, target, tp_group=dist.group.WORLD)
        elif op == "entropy":
            value = vocab_parallel_entropy(local, tp_group=dist.group.WORLD)
        else:
            value = vocab_parallel_cross_entropy(local, target, tp_group=dist.group.WORLD, reduction="none")
        value.sum().backward()
        out[op] = (value.detach(), local.grad)
    result[rank] = out


if __name__ == "__main__":
    want = torch_side()
    got = run_ranks(rank_main, TP, env={"DS_ACCELERATOR": "cpu"})
    differs = []
    for op in OPS:
        value, grad = want[op]
        ds_value = got[0][op][0]
        ds_grad = torch.cat([got[rank][op][1] for rank in range(TP)], dim=-1)
        print(f"{op}: value at the all -inf row: torch {float(value[MASKED])}, DeepSpeed {float(ds_value[MASKED])}; "
              f"its logits' gradient: torch {grad[MASKED, :3].tolist()}..., DeepSpeed {ds_grad[MASKED, :3].tolist()}...")
        if not torch.equal(grad[MASKED].isnan(), ds_grad[MASKED].isnan()):
            differs.append(op)
    print(f"DIFFERS ({', '.join(differs)}): DeepSpeed gives an all -inf row a zero gradient where torch's is nan"
          if differs else "DeepSpeed's gradients at the all -inf row are torch's")
    sys.exit(1 if differs else 0)
