"""The zoo subjects: the arch axis is the installed transformers' causal-LM mapping, the claims name every parameter
the model's plan shards, cases/zoo.toml lists its cases, and two of them run (one trained, one refused)."""
import fnmatch
import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail

if find_spec("transformers") is None:
    skip_or_fail("transformers is not installed (pip install -e '.[hf]'); requirements-cpu.txt pins it")

from parity.axes import AXES  # noqa: E402
from parity.subjects import SUBJECTS  # noqa: E402
from parity.subjects.values import resolve  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STYLE_DIM = {"colwise": 0, "colwise_rep": 0, "colwise_gather_output": 0, "rowwise": 1}
RUN = ("zoo_hf_plan-arch_llama-v125-fp32-zero0-gas2-tp2-cpu", "zoo_hf_plan-arch_mixtral-v125-fp32-zero0-gas2-tp2-cpu")


def parity(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "parity.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          **kwargs)


def test_arch_axis_is_the_installed_mapping():
    from references.zoo import architectures

    assert AXES["arch"].values == tuple(t for t, _ in architectures())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "codegen"])
def test_claims_shard_what_the_plan_shards(arch):
    """Every Linear parameter a colwise/rowwise plan entry names is claimed on that style's dim (the fnmatch
    restatement of the plan's patterns, independent of the subject's regex)."""
    import torch

    subject = SUBJECTS["zoo_hf_plan"]
    values = resolve(subject, {"arch": arch})
    model = subject.build(values, torch.float32)
    claims = subject.claims(values)
    plan = {p[len("model."):] if p.startswith("model.") else p: s for p, s in model._tp_plan.items()}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == "lm_head":
            continue
        styles = [s for p, s in plan.items() if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "model." + p)]
        assert claims.param_shards.get(f"{name}.weight") == (STYLE_DIM.get(styles[-1]) if styles else None), name
    assert claims.module_types["lm_head"] == "LinearLayer" and claims.param_shards["lm_head.weight"] == 0


def test_census_failures_are_skipped_by_name():
    subject = SUBJECTS["zoo_hf_plan"]
    assert subject.invalid(resolve(subject, {"arch": "dbrx"})) is None
    assert "dbrx cannot be built here" in subject.unavailable_reason(resolve(subject, {"arch": "dbrx"}))
    assert "rope_theta" in subject.unavailable_reason(resolve(subject, {"arch": "dbrx"}))
    assert subject.invalid(resolve(subject, {"arch": "gemma3n"})) is None
    assert "timm" in subject.unavailable_reason(resolve(subject, {"arch": "gemma3n"}))


def test_zoo_cases_list_and_two_run(tmp_path):
    listed = parity("list", "--matrix", "cases/zoo.toml")
    assert listed.returncode == 0, listed.stderr
    ids = listed.stdout.split()
    assert set(RUN) <= set(ids) and len(ids) >= 20
    args = [a for case in RUN for a in ("--case", case)]
    ran = parity("run", "--matrix", "cases/zoo.toml", *args, "--report", str(tmp_path), timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    verdicts = {r["case"]: r["verdict"] for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())
                if "case" in r and "verdict" in r}
    assert verdicts == {RUN[0]: "passed", RUN[1]: "passed"}, verdicts


def test_full_zoo_file_lists_every_architecture_through_both_paths_outside_the_default_matrix():
    from parity.axes import ARCHITECTURES
    from parity.matrix.cases import default_files, load

    full = ROOT / "cases" / "zoo" / "full.toml"
    assert full not in [f.resolve() for f in default_files()]
    cases = load([full])
    for subject in ("zoo_hf_plan", "zoo_vocab_parallel"):
        assert sorted(c.values["arch"] for c in cases if c.subject == subject) == sorted(ARCHITECTURES), subject
    assert {(c.values["dtype"], c.values["zero"], c.values["tp"]) for c in cases} == {("fp32", 0, 2)}
