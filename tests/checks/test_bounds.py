"""The element-wise, RMS and stage-local criteria (parity/checks/tolerances.py, stages.py): each
passes an honest result and catches the planted error it is designed for, one the max criterion
alone lets through."""
import numpy as np
import pytest
import torch

from parity.checks import perturb
from parity.checks.compare import compare, reference_pair
from parity.checks.tolerances import (clip_coefficient_error, judge_close, parity_bound, sgd_identity_bound,
                                      unit_roundoff)
from parity.matrix.cases import load
from parity.observe.observations import RankObservations
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve

BF16_U = unit_roundoff("bf16")


def rounded(oracle: np.ndarray, dtype=torch.bfloat16) -> np.ndarray:
    """The oracle rounded once to ``dtype``: what an honest low-precision result looks like."""
    return torch.from_numpy(oracle).to(dtype).double().numpy()


@pytest.fixture
def oracle():
    return np.random.default_rng(0).normal(size=(6, 64)) * np.exp(np.random.default_rng(1).normal(size=(6, 64)))


def test_an_honest_rounding_passes_every_criterion(oracle):
    ref = rounded(oracle)
    other = rounded(oracle * (1 + 1e-9))  # another rounding of the same values: a different run's result
    judged = judge_close(other, ref, oracle, "bf16")
    assert judged.passed, judged


def test_rms_catches_a_systematic_scale_the_max_floor_hides(oracle):
    ref = rounded(oracle)
    scaled = rounded(oracle * (1 + 2.5 * BF16_U))  # 1% in bf16
    max_only = parity_bound("bf16", float(np.abs(ref - oracle).max()), float(np.abs(oracle).max())).value
    assert np.abs(scaled - oracle).max() <= max_only  # the max criterion alone accepts it
    judged = judge_close(scaled, ref, oracle, "bf16")
    assert not judged.passed and judged.criterion == "rms"


def test_element_wise_catches_a_small_entry_under_the_largest(oracle):
    ref = rounded(oracle)
    got = ref.copy()
    max_only = parity_bound("bf16", float(np.abs(ref - oracle).max()), float(np.abs(oracle).max())).value
    order = np.argsort(np.abs(oracle), axis=None)
    small = np.unravel_index(int(order[len(order) // 4]), oracle.shape)  # a quarter of the entries are smaller
    got[small] += 0.5 * max_only  # a small entry corrupted: by half of what the max criterion allows
    assert np.abs(got - oracle).max() <= max_only
    judged = judge_close(got, ref, oracle, "bf16")
    assert not judged.passed and judged.criterion.endswith("element") and judged.index == tuple(int(i) for i in small)


def test_a_low_precision_stage_floor_is_one_rounding_and_catches_a_scale_a_unit_hid(oracle):
    """A bf16 stage accumulates in float32 and rounds each value once: its floor is that rounding, not a
    whole unit. Another float32 accumulation order (a relative 2^-20) rounded to bf16 passes; a subject
    bitwise the reference's but scaled by 1.6 units (0.6%) is caught, which the one-unit floor let through."""
    from parity.checks.tolerances import ONE_ROUNDING_RMS, RMS_FLOOR_ULPS, RMS_SLACK, rms_bound, stage_rms_floor_ulps

    assert stage_rms_floor_ulps("bf16") == stage_rms_floor_ulps("fp16") == ONE_ROUNDING_RMS
    assert stage_rms_floor_ulps("fp32") == RMS_FLOOR_ULPS  # it computes in its floor dtype: summation order shows
    ref = rounded(oracle)
    noise = np.random.default_rng(2).uniform(-1, 1, size=oracle.shape) * 2.0 ** -20
    assert judge_close(rounded(oracle * (1 + noise)), ref, oracle, "bf16", inherits=False).passed
    scaled = ref * (1 + 1.6 * BF16_U)
    judged = judge_close(scaled, ref, oracle, "bf16", inherits=False)
    assert not judged.passed and judged.criterion == "rms", judged
    e, scale = float(np.sqrt(np.mean((ref - oracle) ** 2))), float(np.sqrt(np.mean(oracle ** 2)))
    one_unit_floor = rms_bound(e, BF16_U, scale, inherits=False, floor_ulps=RMS_FLOOR_ULPS)
    assert judged.measured <= one_unit_floor and RMS_SLACK * e < judged.measured


def test_the_floor_is_the_compute_dtype_not_the_case_dtype():
    oracle = np.array(3.25)
    ref = np.array(3.25 + 1e-7)  # a float32 loss from exact bf16 logits
    got = np.array(3.25 * (1 + 1e-4))  # far below bf16's floor, far above float32's
    assert judge_close(got, ref, oracle, "bf16").passed
    assert not judge_close(got, ref, oracle, torch.float32).passed


def test_small_tensors_are_judged_by_the_max_criterion_alone():
    oracle = np.linspace(1, 2, 8)
    ref = rounded(oracle)
    judged = judge_close(rounded(oracle * (1 + 2 * BF16_U)), ref, oracle, "bf16")
    assert judged.criterion == "max"


# -- stage-local oracles, end to end: the reference's own trajectory played back as a subject's -----

CASE = resolve(SUBJECTS["column_gathered"], {"dtype": "bf16", "reduction": "mean", "vocab": 35, "hidden": 32, "bias": True,
                                             "head": "lm_head", "ignore": "scattered", "zero": 0, "gas": 2, "tp": 1,
                                             "dp": 1, "device": "cpu"})


def played_back(subject, values):
    """One rank holding exactly the reference's values: an honest unsharded run at the case dtype."""
    reference, _ = reference_pair(subject, values)
    obs = RankObservations(0, 0, 0)
    for (kind, step, micro, dp, name), tensor in reference.records.items():
        obs.tensors[(kind, step, micro, name)] = tensor.numpy().copy()
    return {0: obs}


def numerical(checks, name):
    """The checks called ``name``: a record kind's (any parameter), or exactly "loss[stage]"."""
    return [c for c in checks if c.name == name or (name.split("[")[0] == name and c.name.split("[")[0] == name
                                                    and not c.name.endswith("[stage]"))]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_stage_checks_pass_the_reference_and_run_on_every_micro_batch(dtype):
    subject, values = SUBJECTS["column_gathered"], CASE.replace(dtype=dtype)
    reference, oracle = reference_pair(subject, values)
    checks = compare(subject, values, played_back(subject, values), reference, oracle)
    for name in ("loss[stage]", "head_input_grad[stage]", "logits[stage]", "grad[lm_head.weight][stage]",
                 "grad[lm_head.bias][stage]", "loss", "logits", "head_input_grad", "grad", "weight"):
        found = numerical(checks, name)
        assert found and all(c.passed for c in found), (name, [c.describe() for c in found if not c.passed])
    assert len(numerical(checks, "loss[stage]")) == len(numerical(checks, "head_input_grad[stage]")) == 10
    assert len(numerical(checks, "logits[stage]")) == 10  # every micro-batch
    assert len(numerical(checks, "grad[lm_head.weight][stage]")) == 5  # every step, its two micro-batches summed
    # A stage check is named as its record kind's, so a known divergence that covers "loss" covers it.
    assert all(c.name.split("[")[0] == "loss" for c in numerical(checks, "loss[stage]"))


def judged_with(observable, mode, eps):
    subject, values = SUBJECTS["column_gathered"], CASE
    reference, oracle = reference_pair(subject, values)
    obs = perturb.perturb(played_back(subject, values), 0, observable, mode, eps, subject.claims(values), 1)
    return compare(subject, values, obs, reference, oracle)


def test_the_loss_stage_catches_what_the_end_to_end_bound_inherits_room_for():
    checks = judged_with("loss", "scale", 1e-4)  # a loss computed in bf16 is off by ~1e-3
    assert all(c.passed for c in numerical(checks, "loss"))  # end to end: within the inherited bf16 rounding
    assert not all(c.passed for c in numerical(checks, "loss[stage]"))


def test_the_head_input_grad_stage_catches_a_one_percent_scale_in_bf16():
    assert not all(c.passed for c in numerical(judged_with("head_input_grad", "scale", 1e-2), "head_input_grad[stage]"))


def test_the_logits_stage_catches_a_scale_the_end_to_end_bound_lets_through():
    checks = judged_with("logits", "scale", 7e-3)  # under 2 unit roundoffs of bf16
    assert all(c.passed for c in numerical(checks, "logits"))
    assert not all(c.passed for c in numerical(checks, "logits[stage]"))


def test_the_head_gradient_stage_catches_a_one_percent_scale_in_bf16():
    checks = judged_with("weight_grad", "scale", 1e-2)
    for name in ("grad[lm_head.weight][stage]", "grad[lm_head.bias][stage]"):
        assert not all(c.passed for c in numerical(checks, name)), name


def test_a_head_input_that_is_not_recorded_fails_the_logits_stage():
    subject, values = SUBJECTS["column_gathered"], CASE
    reference, oracle = reference_pair(subject, values)
    obs = played_back(subject, values)
    del obs[0].tensors[("head_input", 2, 1, None)]
    missing = [c for c in compare(subject, values, obs, reference, oracle) if c.name == "logits[stage]" and not c.passed]
    assert [(c.step, c.micro, c.detail) for c in missing] == [(2, 1, "head input not observed")]


@pytest.mark.parametrize("mode", ["scale", "element", "shard"])
def test_no_perturbation_no_failure_and_a_sign_flip_is_always_caught(mode):
    assert all(c.passed for c in numerical(judged_with("logits", mode, 0.0), "logits"))
    assert not all(c.passed for c in numerical(judged_with("logits", mode, 2.0), "logits"))


TIED_BIAS_CASE = "tied_vocab_parallel-torch-bf16-mean-v34-h35-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-nopad-espec_none"


def test_the_logits_stage_finds_a_tied_heads_own_bias():
    """A tied head's weight is the embedding's, its bias the head's own: the stage must add that bias."""
    from parity.matrix.cases import load

    case = next(c for c in load() if c.id == TIED_BIAS_CASE)
    subject, values = SUBJECTS[case.subject], case.values.replace(tp=1)  # played back: one unsharded rank
    reference, oracle = reference_pair(subject, values)
    checks = compare(subject, values, played_back(subject, values), reference, oracle)
    stage = [c for c in checks if c.name == "logits[stage]"]
    assert stage and all(c.passed for c in stage), [c.describe() for c in stage if not c.passed][:3]


def case_values(case_id: str, **changes):
    (case,) = [c for c in load() if c.id == case_id]
    return case.values.replace(**changes)


def played_back_and_perturbed(subject_name, values, observable=None, mode="scale", eps=0.0):
    subject = SUBJECTS[subject_name]
    reference, oracle = reference_pair(subject, values)
    obs = played_back(subject, values)
    if observable is not None:
        obs = perturb.perturb(obs, 0, observable, mode, eps, subject.claims(values), 1)
    return compare(subject, values, obs, reference, oracle)


TIED = case_values("tied_vocab_parallel-torch-bf16-mean-v34-h35-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-nopad-espec_none",
                   tp=1)


def test_a_tied_head_gradient_is_judged_as_a_stage_on_the_rows_no_token_looked_up():
    checks = played_back_and_perturbed("tied_vocab_parallel", TIED)
    stage = numerical(checks, "grad[embed_tokens.weight][stage]")
    assert len(stage) == 5 and all(c.passed for c in stage), [c.describe() for c in stage if not c.passed]
    # A 1% scale of the whole gradient: end to end the tied gradient (lookup and head) inherits room for it.
    checks = played_back_and_perturbed("tied_vocab_parallel", TIED, "weight_grad", "scale", 1e-2)
    assert not all(c.passed for c in numerical(checks, "grad[embed_tokens.weight][stage]"))


EMBEDDING = case_values("vocab_parallel_embedding-bf16-v34-h32-gas2-tp2-cpu-nopad", tp=1)


def test_an_embedding_loss_is_judged_as_a_stage_from_its_own_lookup():
    checks = played_back_and_perturbed("vocab_parallel_embedding", EMBEDDING)
    stage = numerical(checks, "loss[stage]")
    assert len(stage) == 10 and all(c.passed for c in stage)
    checks = played_back_and_perturbed("vocab_parallel_embedding", EMBEDDING, "loss", "scale", 1e-4)
    assert all(c.passed for c in numerical(checks, "loss"))  # end to end: the table's bf16 drift
    assert not all(c.passed for c in numerical(checks, "loss[stage]"))


def test_a_fused_linear_ce_per_token_loss_has_the_elements_the_rms_criterion_needs():
    values = case_values("ds_fused_linear_ce-bf16-none-v36-bias-ign_scattered-tp2-cpu", tp=1)
    checks = played_back_and_perturbed("ds_fused_linear_ce", values, "loss", "scale", 1e-2)
    assert not all(c.passed for c in numerical(checks, "loss"))


def clipped_fp32_step(seed: int, lr_error: float = 0.0):
    """One clipped SGD step as DeepSpeed's fp32 path takes it (norm, coefficient, g * c and
    w - lr (g c), all in float32) on a weight whose first row starts at zero, as a padding row of a
    tied embedding does (parity explore --seed 1). Returns, for that row: the distance from the
    float64 identity w - lr g c, c from the norm of the subject's recorded gradient as the check
    computes it, and the old and the new bound."""
    rng = np.random.default_rng(seed)
    oracle_g = rng.normal(size=(2, 2)) * 1e-2
    w0 = np.zeros((2, 2))
    w0[1] = rng.normal(size=2)
    lr, clip = 0.1, 0.005
    g32 = torch.tensor(oracle_g, dtype=torch.float32)  # the subject's gradient
    c32 = torch.clamp(clip / (torch.linalg.vector_norm(g32) + 1e-6), max=1.0)
    w = torch.tensor(w0, dtype=torch.float32)
    w.add_(g32 * c32, alpha=-lr * (1 + lr_error))
    got_g, new = g32.double().numpy(), w.double().numpy()
    c = min(1.0, clip / (float(np.linalg.norm(got_g)) + 1e-6))  # Comparison.clip_coefficient without a reported norm
    measured = float(np.abs(new - (w0 - lr * got_g * c))[0].max())
    scale = float(np.abs(new[0]).max())
    old = sgd_identity_bound("fp32", scale, clipped=True)
    bound = sgd_identity_bound("fp32", scale, True, float(np.abs(lr * got_g * c)[0].max()),
                               clip_coefficient_error(False, got_g.size))
    return measured, old, bound


def test_a_clipped_fp32_update_is_bounded_relative_to_the_update_not_only_the_weight():
    runs = [clipped_fp32_step(seed) for seed in range(200)]
    assert all(measured <= bound for measured, _, bound in runs)
    # the bound before: two units of the weight alone, which a row starting at zero exceeds
    assert any(measured > old for measured, old, _ in runs)


def test_the_clipped_update_bound_catches_a_learning_rate_off_by_ten_parts_per_million():
    assert all(measured > bound for measured, _, bound in (clipped_fp32_step(s, lr_error=1e-5) for s in range(200)))


@pytest.mark.parametrize("entries", [4, 1000, 100000])
def test_the_coefficient_error_holds_a_float32_norm_against_the_float64_one(entries):
    values = np.random.default_rng(entries).normal(size=entries).astype(np.float32)
    norm32 = float(torch.linalg.vector_norm(torch.from_numpy(values)))
    norm64 = float(np.linalg.norm(values.astype(np.float64)))
    assert abs(norm64 / norm32 - 1) <= clip_coefficient_error(False, entries)
    assert clip_coefficient_error(True, entries) == 0.0


def test_zero_is_within_the_bound_of_a_cancelled_gradient_only():
    """grad_nonzero (Comparison.check_step) accepts an all-zero gradient where the oracle's is nonzero
    only if zero passes the grad check's own bound: a bf16 gradient that cancels to 1e-5 of its terms,
    where the bf16 reference itself is 50% off (parity explore --seed 2), but not an ordinary one."""
    oracle = np.array([[-3.6e-7, -3.1e-6], [1.9e-6, 1.6e-5]])
    cancelled_ref = oracle * np.array([[0.98, 0.98], [1.49, 1.49]])
    assert judge_close(np.zeros_like(oracle), cancelled_ref, oracle, "bf16").passed
    ordinary = np.random.default_rng(0).normal(size=(2, 2)) * 1e-3
    assert not judge_close(np.zeros_like(ordinary), rounded(ordinary), ordinary, "bf16").passed
