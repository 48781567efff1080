"""The precision contract can fail: a tensor of another dtype, or on another device, than the
reference's at the same point fails `contract[<kind>]`, even where every number is within bounds."""
import pytest
import torch

from parity.checks.compare import compare, reference_pair
from parity.checks.verdict import FAILED
from parity.observe.observations import RankObservations
from parity.observe.partition import shard_slice
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve

CE_VALUES = resolve(SUBJECTS["ds_vocab_ce"], {"dtype": "bf16", "reduction": "none", "vocab": 35, "ignore": "scattered",
                                             "tp": 2, "device": "cpu", "backward": "once", "seed": 0})


def honest_observations(subject, values, reference, dtype_of=None):
    """What a correct loss-only subject hands back: the reference's tensors at the reference's dtype,
    each rank its vocabulary block; ``dtype_of`` overrides the dtype of some kinds (the planted bug)."""
    observations = {}
    for rank in range(values["tp"]):
        o = RankObservations(rank, rank, 0)
        o.facts.update(rank_device="cpu", state_at_start={})
        for kind, dim in subject.claims(values).micro_records.items():
            full = reference.get(kind, 0, 0, 0, None)
            dtype = getattr(torch, reference.layouts[(kind, 0, 0, 0, None)][0])
            if dtype_of and kind in dtype_of:
                dtype = dtype_of[kind]
            block = full if dim is None else full[:, shard_slice(values["vocab"], values["tp"], rank)]
            o.record(kind, 0, 0, None, block.to(dtype))
        observations[rank] = o
    return observations


@pytest.fixture(scope="module")
def ce():
    subject = SUBJECTS["ds_vocab_ce"]
    return subject, reference_pair(subject, CE_VALUES)


def test_an_honest_subject_meets_the_contract(ce):
    subject, (reference, oracle) = ce
    checks = compare(subject, CE_VALUES, honest_observations(subject, CE_VALUES, reference), reference, oracle)
    contract = [c for c in checks if c.name.startswith("contract[")]
    assert {c.name for c in contract} == {"contract[loss]", "contract[logits_grad]", "contract[logits_after]"}
    assert all(c.passed for c in checks), [c.describe() for c in checks if not c.passed]


def test_a_float32_gradient_in_a_bf16_case_is_silently_accepted_by_the_numbers_but_fails_the_contract(ce):
    subject, (reference, oracle) = ce
    observations = honest_observations(subject, CE_VALUES, reference, {"logits_grad": torch.float32})
    checks = compare(subject, CE_VALUES, observations, reference, oracle)
    failed = [c for c in checks if not c.passed]
    assert {c.name for c in failed} == {"contract[logits_grad]"}  # every bound holds: the values are exact
    assert "dtype float32, reference bfloat16" in failed[0].detail


def test_a_tensor_on_another_device_fails_the_contract(ce):
    subject, (reference, oracle) = ce
    observations = honest_observations(subject, CE_VALUES, reference)
    observations[1].facts["rank_device"] = "cuda:1"  # as if the rank ran on a GPU but handed back CPU tensors
    failed = [c for c in compare(subject, CE_VALUES, observations, reference, oracle) if not c.passed]
    assert {(c.name, c.rank) for c in failed} == {("contract[loss]", 1), ("contract[logits_grad]", 1),
                                                  ("contract[logits_after]", 1)}
    assert "on cpu, rank runs on cuda:1" in failed[0].detail


def test_a_tensor_the_reference_does_not_hold_fails_the_contract(ce):
    subject, (reference, oracle) = ce
    observations = honest_observations(subject, CE_VALUES, reference)
    for o in observations.values():  # on every rank alike, so only the contract can object
        o.record("logits_hvp", 0, 0, None, torch.zeros(3))  # a kind of the schema this case's reference lacks
    failed = [c for c in compare(subject, CE_VALUES, observations, reference, oracle) if not c.passed]
    assert {c.name for c in failed} == {"contract[logits_hvp]"}
    assert "the reference holds no tensor here" in failed[0].detail


def test_float32_logits_from_a_bf16_head_fail_end_to_end():
    """A spawned bf16 case whose head hands back its logits upcast to float32 (tests/faulty_subjects.py)."""
    from pathlib import Path

    from parity.harness.runner import Runner
    from parity.matrix.cases import load_file

    faulty = Path(__file__).resolve().parents[1] / "cases" / "faulty.toml"
    case = next(c for c in load_file(faulty) if c.subject == "faulty_fp32_logits")
    runner = Runner(timeout_s=120)
    try:
        verdict = runner.run(case)
    finally:
        runner.close()
    assert verdict.status == FAILED, verdict.explain()
    assert {c.name for c in verdict.failed_checks} == {"contract[logits]"}, verdict.explain()
    assert "dtype float32, reference bfloat16" in verdict.failed_checks[0].detail


def test_a_master_rounded_to_bf16_after_every_update_fails_the_master_weight_check():
    """FP16_UnfusedOptimizer with its float32 master rounded to bf16 after each step (the mutant
    unfused_master_in_model_dtype): the bf16 weights stay within their bound, the master does not."""
    from parity.harness.runner import Runner, run_settings
    from parity.matrix.cases import load

    case = next(c for c in load() if c.id == "column_gathered-bf16-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2"
                                              "-tp2-cpu")
    verdicts = {}
    for mutant in ("", "unfused_master_in_model_dtype"):
        runner = Runner(run_settings(timeout_s=120, mutant=mutant))  # its ranks plant the mutant
        try:
            verdicts[mutant] = runner.run(case)
        finally:
            runner.close()
    honest, mutated = verdicts[""], verdicts["unfused_master_in_model_dtype"]
    assert any(c.name.startswith("master_weight[") for c in honest.checks)
    assert not [c for c in honest.failed_checks if c.name.startswith("master_weight[")], honest.explain()
    failed = {c.name.split("[")[0] for c in mutated.failed_checks}
    assert "master_weight" in failed and "weight" not in failed, mutated.explain()


def test_an_empty_tensor_is_held_to_its_device_not_its_dtype():
    """An empty shard holds no value a dtype could change (parity explore --seed 9: DeepSpeed hands back
    the bf16 p.grad of a row head's empty hidden shard); a non-empty one of the same dtype still fails."""
    from types import SimpleNamespace

    from parity.checks.contract import contract_checks

    reference = SimpleNamespace(layouts={("grad", 0, None, None, "w"): ("float32",)})

    def checks(shape, device="cpu"):
        o = RankObservations(1, 1, 0)
        o.facts.update(rank_device="cpu")
        o.record("grad", 0, None, "w", torch.zeros(shape, dtype=torch.bfloat16))
        if device != "cpu":
            o.devices[("grad", 0, None, "w")] = device
        return [c["passed"] for c in contract_checks({1: o}, reference)]

    assert checks((2, 0)) == [True]
    assert checks((2, 1)) == [False]
    assert checks((2, 0), device="cuda:0") == [False]
