"""A new framework is one subject module and one case file: nothing else names it. A toy framework built in a
temporary directory from exactly those two files is listed by --framework, runs, shows in the frameworks table
(docs/subjects.md), and the mutation check kills a bug planted in it (a mutant its own module declares for its family)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A vocabulary-parallel CE on plain torch.distributed: each rank holds a block of the logits' columns and
# all-reduces the row maxima, the exp-sums and the target logits.
TOY_MODULE = '''
import sys

import torch
import torch.distributed as dist

from parity.mutation.catalog import Mutant, register
from parity.subjects.loss_only import IGNORE_INDEX, LogitsCE


def reduce_sum_exp(sum_exp, group):
    dist.all_reduce(sum_exp, group=group)
    return sum_exp


class ToyCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, targets, group, start):
        m = local.max(-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        exp = (local - m[:, None]).exp()
        sum_exp = reduce_sum_exp(exp.sum(-1), group)
        owned = (targets >= start) & (targets < start + local.shape[-1])
        column = (targets - start).clamp(0, local.shape[-1] - 1)
        target = torch.where(owned, local.gather(-1, column[:, None])[:, 0] - m, torch.zeros_like(m))
        dist.all_reduce(target, group=group)
        ignored = targets == IGNORE_INDEX
        ctx.save_for_backward(exp / sum_exp[:, None], column, owned, ignored)
        return torch.where(ignored, torch.zeros_like(m), sum_exp.log() - target)

    @staticmethod
    def backward(ctx, grad):
        softmax, column, owned, ignored = ctx.saved_tensors
        grad_local = softmax.clone()
        grad_local[torch.arange(len(column)), column] -= owned.to(softmax.dtype)
        return grad_local * torch.where(ignored, torch.zeros_like(grad), grad)[:, None], None, None, None


class ToyVocabCE(LogitsCE):
    name = "toy_vocab_ce"
    framework = "toy"
    feature = "vocab-parallel head + CE"
    description = "a toy vocabulary-parallel CE on plain torch.distributed"
    axes = {"dtype": ["fp32"], "vocab": None, "ignore": None, "tp": None, "device": ["cpu"]}

    def loss(self, values, ctx, local, targets, group, part, obs):
        return ToyCE.apply(local, targets, group, part.start)


SUBJECTS = [ToyVocabCE()]


def _local_sum_exp():
    module = sys.modules[__name__]
    original = module.reduce_sum_exp
    module.reduce_sum_exp = lambda sum_exp, group: sum_exp
    return lambda: setattr(module, "reduce_sum_exp", original)


register(Mutant("toy_local_sum_exp", "the toy CE's softmax denominator is the local exp-sum (SUM all-reduce dropped)",
                "toy_framework.reduce_sum_exp", "loss", ("toy_vocab_ce",), _local_sum_exp))
'''

TOY_CASES = '''
[[matrix]]
subject = "toy_vocab_ce"
[matrix.axes]
dtype = ["fp32"]
vocab = [35]
ignore = ["scattered"]
tp = [2]
device = ["cpu"]
'''

TABLE = ("from parity.matrix.cases import load\nfrom parity.matrix.frameworks import framework_table\n"
         "print(framework_table(load()))")


def test_a_new_framework_is_one_module_and_one_case_file(tmp_path):
    (tmp_path / "toy_framework.py").write_text(textwrap.dedent(TOY_MODULE))
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "toy.toml").write_text(TOY_CASES)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "PARITY_SUBJECT_MODULES": "toy_framework", "PARITY_CASES_DIR": str(tmp_path / "cases")}

    def parity(*args):
        return subprocess.run([sys.executable, "-m", "parity.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    listed = parity("list", "--framework", "toy")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert listed.stdout.split() == ["toy_vocab_ce-fp32-v35-ign_scattered-tp2-cpu"]

    ran = parity("run", "--framework", "toy")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout, ran.stdout

    table = subprocess.run([sys.executable, "-c", TABLE], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].endswith("| toy |")
    assert "| vocab-parallel head + CE |" in table.stdout and table.stdout.count("| 1 / 0 / 0 |") == 1

    killed = parity("mutants", "--mutant", "toy_local_sum_exp")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "kill rate: 1/1 cells" in killed.stdout, killed.stdout
