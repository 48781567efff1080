"""Rounding samples (parity/checks/rounding.py) and the second estimate they give a small tensor's bound
(parity/checks/tolerances.py): a cancelling sum's error is relative to its terms, and the samples
see that where the reference's one error and max|oracle| do not; they never rescue an error of
another kind, and they are taken only when a small tensor misses its first bound."""
import numpy as np
import torch

from parity.checks import rounding
from parity.checks.compare import Comparison, reference_pair
from parity.checks.tolerances import FLOOR_ULPS, ROUNDING_SAMPLES, SHARDING_SLACK, judge_close, unit_roundoff
from parity.matrix.cases import load
from parity.subjects import SUBJECTS

U32 = unit_roundoff("fp32")
CASE_ID = "direct_vocab_parallel-bf16-mean-v34-h32-bias-lm_head-ign_scattered-gas2-tp2-cpu"


def test_the_noise_is_relative_to_each_op_and_leaves_exact_ops_alone():
    a = torch.linspace(0.1, 1.0, 64, dtype=torch.float32)
    with rounding.RoundingNoise(0):
        total = a.sum()  # rounds: at most one float32 unit (2u relative) from the unperturbed result
        picked = a[1:].clone()  # indexing and copies are exact
        grown = a.double()  # a widening cast is exact
        b = a.clone()
        b.add_(1.0)  # in place: the tensor the caller holds is the moved one
    assert abs(float(total) - float(a.sum())) <= 2 * U32 * abs(float(a.sum()))
    assert torch.equal(picked, a[1:]) and torch.equal(grown, a.double())
    moved = (b - (a + 1.0)).abs()
    assert bool((moved > 0).any()) and bool((moved <= 2 * U32 * (a + 1.0)).all())


def test_an_op_on_the_meta_device_is_left_alone():
    """A model built on the meta device and then loaded (transformers' from_pretrained) runs ops on meta tensors:
    they hold no values, so the noise leaves them alone instead of mixing a CPU draw into them."""
    with rounding.RoundingNoise(0):
        out = torch.ones(4, device="meta").exp()
    assert out.is_meta and out.shape == (4,)


def test_samples_are_seeded():
    a = torch.linspace(-1, 1, 64, dtype=torch.float32)

    def run(seed):
        with rounding.RoundingNoise(seed):
            return (a * 3.0).exp().sum()
    assert torch.equal(run(3), run(3)) and not torch.equal(run(3), run(4))


def test_a_cancelling_sum_samples_an_error_relative_to_its_terms():
    """w0 d + w1 (-d) with w0 ~ w1: the terms are ~1, the result ~1e-3; its samples' error is of the
    terms' size, tens of units of the result, which the floor (relative to the result) does not allow."""
    w = torch.tensor([1.0, 1.0 - 2 ** -10], dtype=torch.float32)
    d = torch.tensor([0.3, -0.3], dtype=torch.float32)
    exact = float((w.double() * d.double()).sum())
    errors = []
    for seed in range(ROUNDING_SAMPLES):
        with rounding.RoundingNoise(seed):
            errors.append(abs(float((w * d).sum()) - exact))
    assert max(errors) > FLOOR_ULPS * U32 * abs(exact)
    assert max(errors) < 4 * U32 * float((w * d).abs().sum())


def small_cancelling(measured_in_units_of_terms):
    """A 2-entry tensor of cancelling sums (terms ~1, results ~1e-3) and the errors three runs make."""
    oracle = np.array([1e-3, -2e-3])
    ref = oracle + np.array([1e-10, -1e-10])  # the reference happened to round almost exactly
    got = oracle + measured_in_units_of_terms * U32
    return got, ref, oracle


def test_a_small_cancelling_tensor_gets_the_samples_bound():
    got, ref, oracle = small_cancelling(3.0)  # three units of the terms: an honest other rounding
    first = judge_close(got, ref, oracle, "fp32")
    assert not first.passed and first.criterion == "max"
    sampled = judge_close(got, ref, oracle, "fp32", lambda: np.full((ROUNDING_SAMPLES, 2), 2 * U32))
    assert sampled.passed and sampled.criterion == "sampled max"
    assert sampled.bound == SHARDING_SLACK * 2 * U32 + FLOOR_ULPS * U32 * 2e-3


def test_the_samples_do_not_rescue_an_error_beyond_them():
    got, ref, oracle = small_cancelling(100.0)  # a hundred units of the terms: not rounding
    assert not judge_close(got, ref, oracle, "fp32", lambda: np.full((ROUNDING_SAMPLES, 2), 2 * U32)).passed


def test_samples_within_the_floor_change_nothing():
    """A tensor that does not cancel: samples within FLOOR_ULPS units of max|oracle| leave the first
    bound as it was, however small the reference's own error happened to be."""
    oracle = np.array([2.0, 3.0])
    ref = oracle.copy()
    got = oracle * (1 + 20 * U32)
    within_floor = lambda: np.full((ROUNDING_SAMPLES, 2), FLOOR_ULPS * U32 * 3.0 * 0.9)  # noqa: E731
    first, again = judge_close(got, ref, oracle, "fp32"), judge_close(got, ref, oracle, "fp32", within_floor)
    assert not first.passed and (again.passed, again.criterion, again.bound) == (False, "max", first.bound)


def test_samples_are_taken_only_for_a_tensor_that_misses_a_bound():
    def refuse():
        raise AssertionError("sampled without need")
    got, ref, oracle = small_cancelling(0.0)
    assert judge_close(got, ref, oracle, "fp32", refuse).passed  # passes its first bound
    big = np.linspace(1, 2, 64)
    ref = big * (1 + U32 * np.sin(np.arange(64)))
    assert judge_close(ref, ref, big, "fp32", refuse).passed  # 64 entries within their RMS: never sampled


def test_a_large_tensor_of_inherited_cancelling_errors_gets_the_samples_rms():
    """Entries that all inherit a few cancelling sums' errors (a vocabulary-2 head's input gradient
    behind the attention projections' weight gradients): the reference's one RMS error does not
    measure a correct run's; where the samples' RMS error exceeds FLOOR_ULPS units of the values'
    RMS, the RMS bound is RMS_SLACK x the samples' RMS."""
    oracle = np.linspace(-1e-3, 1e-3, 64)
    ref = oracle + 1e-9 * np.sign(np.sin(np.arange(64)))
    got = oracle + 4e-9 * np.sign(np.cos(np.arange(64)))  # another rounding of the same sums: 4x
    first = judge_close(got, ref, oracle, "fp32")
    assert not first.passed and first.criterion == "rms"
    sampled = judge_close(got, ref, oracle, "fp32", lambda: np.full((ROUNDING_SAMPLES, 64), 3e-9))
    assert sampled.passed
    assert not judge_close(oracle * (1 + 1e-4), ref, oracle, "fp32", lambda: np.full((ROUNDING_SAMPLES, 64), 3e-9)).passed


def test_an_entry_of_inherited_cancelling_errors_gets_the_samples_element_bound():
    """The element criterion on the same kind of tensor (parity explore --seed 8: hf_plan_tied vocab 2,
    a q_proj weight-gradient entry at 1.37x): where the samples' RMS error disproves the premise, an
    entry is held to the samples' error, its own and its neighbourhood's, not to the reference's one
    rounding; samples within the floor change nothing."""
    n = 1024
    oracle = np.linspace(-1e-3, 1e-3, n)
    oracle[0] = 1.0  # one large entry: the max criterion's floor is far above the small ones
    ref = oracle + 1e-9 * np.sign(np.sin(np.arange(n)))
    got = oracle + 1e-9 * np.sign(np.cos(np.arange(n)))
    got[7] = oracle[7] + 40e-9
    first = judge_close(got, ref, oracle, "fp32")
    assert not first.passed and first.criterion == "element" and first.index == (7,)
    sampled = judge_close(got, ref, oracle, "fp32", lambda: np.full((ROUNDING_SAMPLES, n), 5e-8))  # 16 units of rms(oracle) is 3e-8
    assert sampled.passed
    within = judge_close(got, ref, oracle, "fp32", lambda: np.full((ROUNDING_SAMPLES, n), 2e-10))
    assert (within.passed, within.criterion, within.bound) == (False, "element", first.bound)
    far = got.copy()
    far[7] = oracle[7] + 3e-6  # beyond what the samples allow an entry
    assert not judge_close(far, ref, oracle, "fp32", lambda: np.full((ROUNDING_SAMPLES, n), 5e-8)).passed


def test_rms_samples_within_the_floor_change_nothing():
    oracle = np.linspace(1.0, 2.0, 64)
    ref = oracle * (1 + U32 * np.sign(np.sin(np.arange(64))))
    got = oracle * (1 + 4 * U32 * np.sign(np.cos(np.arange(64))))
    first = judge_close(got, ref, oracle, "fp32")
    within = judge_close(got, ref, oracle, "fp32", lambda: np.full((ROUNDING_SAMPLES, 64), 2 * U32))  # rounding of the values
    assert not first.passed and (within.passed, within.criterion, within.bound) == (False, first.criterion, first.bound)


def test_the_reruns_reproduce_every_record_of_the_reference():
    """The samples are the case-dtype reference rerun: the same records, each near the reference."""
    case = next(c for c in load() if c.id == CASE_ID)
    subject = SUBJECTS[case.subject]
    reference, oracle = reference_pair(subject, case.values)
    spread = rounding.sampled_error(subject, case.values, oracle, 2)
    # a low-precision reference's float32 masters are measured against the oracle's weights
    mapped = {k for k in reference.records if (rounding.ORACLE_KIND.get(k[0], k[0]), *k[1:]) in oracle.records}
    assert set(spread.records) == mapped
    assert ("master_weight", 0, None, None, "lm_head.bias") in spread.records
    assert all(v.shape[0] == 2 for v in spread.records.values())  # each sample's errors, stacked
    grad = ("grad", 0, None, None, "lm_head.weight")
    assert 0 < float(spread.records[grad].max()) < 0.1 * float(oracle.records[grad].abs().max())


def test_a_comparison_takes_the_samples_once():
    case = next(c for c in load() if c.id == CASE_ID)
    subject = SUBJECTS[case.subject]
    reference, oracle = reference_pair(subject, case.values)
    rounding.clear_cache()
    cmp = Comparison(subject, case.values, {}, reference, oracle)
    calls = []
    original = rounding.sampled_error
    rounding.sampled_error = lambda *a: calls.append(a) or original(subject, case.values, oracle, 1)
    try:
        first = cmp.sampled_error("grad", 0, None, None, "lm_head.bias")()
        again = cmp.sampled_error("weight", 0, None, None, "lm_head.bias")()
    finally:
        rounding.sampled_error = original
        rounding.clear_cache()
    assert len(calls) == 1 and first.shape == again.shape == (1, 34)  # one sample, stacked


def test_the_samples_leave_a_references_exact_inputs_alone():
    """The subject receives the reference's inputs exactly (a float32 draw cast to bf16 once): a
    rerun that moved that cast would sample an error no correct subject can make. Found by the
    mutation check: DeepSpeed's CE with its exp-sums all-reduced in bf16 survived on ds_vocab_ce,
    whose loss bound the samples had widened to the bf16 rounding of the input logits."""
    from references.cross_entropy import ce_inputs
    from references.seeding import exact_inputs

    with rounding.RoundingNoise(0):
        logits, _, _ = ce_inputs(3, 6, 35, "scattered", torch.bfloat16)
        with exact_inputs():
            made = torch.full((4,), 1 / 3, dtype=torch.float32) * 3
        moved = torch.full((64,), 1 / 3, dtype=torch.float32) * 3
    assert torch.equal(logits, ce_inputs(3, 6, 35, "scattered", torch.bfloat16)[0])
    assert torch.equal(made, torch.full((4,), 1 / 3, dtype=torch.float32) * 3)
    assert not torch.equal(moved, torch.full((64,), 1 / 3, dtype=torch.float32) * 3)  # the rest is sampled


def test_the_samples_leave_every_references_initial_weights_alone():
    """Initial weights are drawn in float32 and cast to the case dtype: the subject gets the cast
    values, so the cast is an exact input. It once ran outside exact_inputs() and the samples moved
    every bf16 initial weight by up to a unit: a sampled master-weight error of 2e-3 where the
    reference's was 4e-7, wide enough to pass a master kept in bf16."""
    from references.embedding_lookup import build_embedding
    from references.tiny_lm import ModelSpec, build_model

    spec = ModelSpec(vocab=35, hidden=32)
    with rounding.RoundingNoise(0):
        noisy = [build_model(spec, 3, torch.bfloat16).state_dict(), build_embedding(35, 32, None, 3, torch.bfloat16)
                 .state_dict()]
    plain = [build_model(spec, 3, torch.bfloat16).state_dict(), build_embedding(35, 32, None, 3, torch.bfloat16)
             .state_dict()]
    for got, want in zip(noisy, plain):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_master_moved_by_a_cancelling_gradient_gets_the_samples_bound():
    """tolerances.master_weight_sampled_bound: the samples widen a master's bound only where they
    exceed both the reference's error and the movement floor; a master kept in bf16 (a unit of the
    weight off) is beyond any bound the samples give."""
    from parity.checks.tolerances import master_weight_bound, master_weight_sampled_bound

    u = unit_roundoff("bf16")
    movement, scale, ref_err = 4e-5, 0.4, 4e-7
    first = master_weight_bound("bf16", ref_err, scale, movement)
    assert master_weight_sampled_bound("bf16", first, ref_err, movement) is None
    assert master_weight_sampled_bound("bf16", first, 0.9 * FLOOR_ULPS * u * movement, movement) is None
    wider = master_weight_sampled_bound("bf16", first, 1e-5, movement)
    assert wider is not None and wider.value > first.value and wider.value < 1e-4
    assert u * scale > 10 * wider.value  # a bf16 master's rounding of the weight stays a failure


def test_stage_samples_move_the_stage_and_leave_its_inputs_and_reference_alone():
    """The head-gradient stage's rounding samples (stages.sampled_logits_grads / sampled_head_param_grads):
    the subject's recorded logits and head inputs are the stage's exact inputs, so a sample moves only
    the stage's own roundings, by about a unit; the stage reference's cache never holds a sample."""
    from parity.checks import stages
    from references.tiny_lm import ModelSpec
    from references.trajectory import TrainingSpec

    spec, train = ModelSpec(vocab=3, hidden=8), TrainingSpec(micro_batches=1)
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(2, 6, 3, generator=gen).to(torch.bfloat16).double().numpy()]
    labels = [torch.randint(0, 3, (2, 6), generator=gen)]
    xs = [torch.randn(2, 6, 8, generator=gen).to(torch.bfloat16).double().numpy()]
    bf16 = torch.bfloat16
    _, _, dz = stages.losses_and_head_input_grads(logits, labels, None, [12], spec, train, bf16)
    noisy_dz = stages.sampled_logits_grads(logits, labels, [12], spec, train, bf16, 0)
    assert torch.equal(noisy_dz[0], stages.sampled_logits_grads(logits, labels, [12], spec, train, bf16, 0)[0])
    assert not torch.equal(noisy_dz[0], dz[0])
    assert float((noisy_dz[0].double() - dz[0].double()).abs().max()) <= 4 * unit_roundoff("bf16")
    again = stages.losses_and_head_input_grads(logits, labels, None, [12], spec, train, bf16)[2]
    assert torch.equal(again[0], dz[0])  # not the sample
    w, b = stages.head_param_grads(dz, xs, bf16, True)
    noisy_w, noisy_b = stages.sampled_head_param_grads(noisy_dz, xs, bf16, True, 0)
    scale = np.abs(dz[0].double().numpy()).sum(0)  # the bias sums |dz| over tokens: its error is relative to that
    assert np.all(np.abs(noisy_b - b) <= 8 * unit_roundoff("bf16") * scale + 1e-12)
    assert noisy_w.shape == w.shape and not np.array_equal(noisy_w, w)


def test_dispersed_samples_widen_the_rms_bound_to_theirs():
    """The RMS's premise, that one correct run's RMS error stands for another's within RMS_SLACK, checked
    on the samples: where their RMS errors spread beyond DISPERSED_SPREAD (vocabulary-269 bias gradients:
    the reference 0.3 units of u rms(oracle), the samples 0.45-3.3, a correct subject 1.64), the bound is
    RMS_SLACK x the largest sample's. Samples that agree change nothing, and the widened bound still
    fails an error beyond it."""
    from parity.checks.tolerances import DISPERSED_SPREAD, RMS_FLOOR_ULPS, RMS_SLACK, dispersed

    n = 88
    oracle = np.linspace(1.0, 2.0, n)
    unit = U32 * float(np.sqrt(np.mean(oracle ** 2)))
    ref = oracle + 0.3 * unit * np.sign(np.sin(np.arange(n)))
    got = oracle + 1.64 * unit * np.sign(np.cos(np.arange(n)))
    first = judge_close(got, ref, oracle, "fp32")
    assert not first.passed and first.criterion == "rms"
    agree = np.full((ROUNDING_SAMPLES, n), 0.5 * unit)  # within SAMPLES_WIDTH of the reference's 0.3
    assert not dispersed(agree) and not dispersed(None)
    assert judge_close(got, ref, oracle, "fp32", lambda: agree).bound == first.bound
    spread = np.full((ROUNDING_SAMPLES, n), unit) * np.linspace(0.45, 3.3, ROUNDING_SAMPLES)[:, None]
    assert dispersed(spread) and 3.3 / 0.45 > DISPERSED_SPREAD
    assert not dispersed(spread[[0, -1]] * [[1.0], [0.9 * DISPERSED_SPREAD * 0.45 / 3.3]])
    assert judge_close(got, ref, oracle, "fp32", lambda: spread).passed
    # Within RMS_SAMPLED_REACH of the first bound, under the widened one (RMS_SLACK x 3.3 + 1 units): passes.
    near = oracle + 5.5 * unit * np.sign(np.cos(np.arange(n)))
    assert judge_close(near, ref, oracle, "fp32", lambda: spread).passed
    beyond = oracle + 1.02 * (RMS_SLACK * 3.3 + RMS_FLOOR_ULPS) * unit * np.sign(np.cos(np.arange(n)))
    assert not judge_close(beyond, ref, oracle, "fp32", lambda: spread).passed
    assert not judge_close(oracle * (1 + 12 * U32), ref, oracle, "fp32", lambda: spread).passed


def test_dispersion_is_estimated_over_the_records_steps():
    """Eight samples' range estimates the spread with a noise of about 29% (d3 / d2 for n = 8); a tensor's
    few-source structure is its computation's, the same at every step, so the spread is also taken as
    the geometric mean over the record's steps. parity explore --seed 0 (hf_plan_row bf16, vocabulary 2,
    a k_proj weight-gradient shard): step 1's samples spread 2.46, the five steps' 4.5, 2.5, 4.9, 3.1,
    4.7 (geometric mean 3.8); the reference 1.96 units, a correct subject 8.6 (1.12x its first bound).
    A trajectory of agreeing steps leaves the step's own verdict alone."""
    from parity.checks.tolerances import DISPERSED_SPREAD, RMS_FLOOR_ULPS, RMS_SLACK, dispersed

    n = 256
    oracle = np.linspace(1.0, 2.0, n)
    unit = U32 * float(np.sqrt(np.mean(oracle ** 2)))

    def samples(low, high):
        return np.full((ROUNDING_SAMPLES, n), unit) * np.geomspace(low, high, ROUNDING_SAMPLES)[:, None]
    step1 = samples(2.6, 6.4)
    steps = [samples(7.1, 31.9), step1, samples(3.3, 16.0), samples(4.9, 15.0), samples(5.0, 23.5)]
    assert 6.4 / 2.6 < DISPERSED_SPREAD and not dispersed(step1)
    assert dispersed(step1, lambda: steps)
    calm = [samples(2.6, 2.6 * 1.5) for _ in range(4)] + [step1]
    assert not dispersed(step1, lambda: calm) and not dispersed(step1, lambda: [step1])
    ref = oracle + 1.96 * unit * np.sign(np.sin(np.arange(n)))
    got = oracle + 8.6 * unit * np.sign(np.cos(np.arange(n)))

    def sampled():
        return step1
    assert not judge_close(got, ref, oracle, "fp32", sampled).passed
    sampled.steps = lambda: steps
    assert judge_close(got, ref, oracle, "fp32", sampled).passed
    # The widened bound is this step's largest sample's (RMS_SLACK x 6.4 + 1 units), not the trajectory's.
    beyond = oracle + 1.02 * (RMS_SLACK * 6.4 + RMS_FLOOR_ULPS) * unit * np.sign(np.cos(np.arange(n)))
    judged = judge_close(beyond, ref, oracle, "fp32", sampled)
    assert not judged.passed and judged.criterion == "dispersed rms"


def test_an_inherited_rms_error_gets_the_sharding_slack_and_a_stage_does_not():
    """The part of the reference's RMS error beyond one rounding of the values was inherited from
    upstream (a trained bf16 tied head's input gradient: reference 2.05 units, a correct subject 5.13):
    SHARDING_SLACK holds it; a stage-local check starts from exact inputs and keeps RMS_SLACK."""
    from parity.checks.tolerances import (ONE_ROUNDING_RMS, RMS_FLOOR_ULPS, RMS_SLACK, SHARDING_SLACK,
                                          rms_bound)

    one = ONE_ROUNDING_RMS
    assert rms_bound(0.5, 1.0, 1.0) == RMS_SLACK * 0.5 + RMS_FLOOR_ULPS  # within one rounding: as before
    assert abs(rms_bound(2.05, 1.0, 1.0) - (RMS_SLACK * one + SHARDING_SLACK * (2.05 - one) + RMS_FLOOR_ULPS)) < 1e-12
    assert rms_bound(2.05, 1.0, 1.0, inherits=False) == RMS_SLACK * 2.05 + RMS_FLOOR_ULPS
    n = 420
    oracle = np.linspace(1.0, 2.0, n)
    unit = U32 * float(np.sqrt(np.mean(oracle ** 2)))
    ref = oracle + 2.05 * unit * np.sign(np.sin(np.arange(n)))
    got = oracle + 5.13 * unit * np.sign(np.cos(np.arange(n)))
    assert judge_close(got, ref, oracle, "fp32").passed
    assert not judge_close(got, ref, oracle, "fp32", inherits=False).passed


def test_a_lucky_reference_gets_the_smallest_sample_over_the_samples_width():
    """parity explore --seed 10 (direct_vocab_parallel fp32, vocabulary 177, an 88-entry bias-gradient
    shard): the reference 0.41 units of u rms(oracle), the samples 1.31-3.47 (not dispersed), a correct
    subject 1.88. Every sample over SAMPLES_WIDTH exceeds one rounding of the values and the reference
    lies below it: a lucky draw, so the smallest sample over SAMPLES_WIDTH stands for its RMS error in the
    same RMS bound. Otherwise nothing changes, and the stand-in bound still fails a scale of a few units
    and an error beyond it."""
    from parity.checks.tolerances import (MCA_ONE_ROUNDING, ONE_ROUNDING_RMS, SAMPLES_WIDTH, dispersed,
                                          lucky_stand_in, rms_bound)

    n = 88
    oracle = np.linspace(1.0, 2.0, n)
    rms_scale = float(np.sqrt(np.mean(oracle ** 2)))
    unit = U32 * rms_scale
    ref = oracle + 0.41 * unit * np.sign(np.sin(np.arange(n)))
    got = oracle + 1.88 * unit * np.sign(np.cos(np.arange(n)))
    samples = np.full((ROUNDING_SAMPLES, n), unit) * np.linspace(1.31, 3.47, ROUNDING_SAMPLES)[:, None]
    assert not dispersed(samples)
    first = judge_close(got, ref, oracle, "fp32")
    assert not first.passed and first.criterion == "rms"
    lucky = judge_close(got, ref, oracle, "fp32", lambda: samples)
    assert lucky.passed
    one_rounding = ONE_ROUNDING_RMS * unit
    stand_in = lucky_stand_in(samples, 0.41 * unit, one_rounding)
    assert abs(stand_in - 1.31 * unit / SAMPLES_WIDTH) < 1e-6 * unit
    assert lucky.bound >= rms_bound(stand_in, U32, rms_scale)
    # Samples within what one rounding of the values gives them (an exact-ish reference beside the
    # samples' wider moves), or a reference beyond one rounding itself: not lucky, the bound as it was.
    within = samples * (0.99 * ONE_ROUNDING_RMS * MCA_ONE_ROUNDING / 1.31)
    assert lucky_stand_in(within, 0.41 * unit, one_rounding) is None
    assert judge_close(got, ref, oracle, "fp32", lambda: within).bound == first.bound
    assert lucky_stand_in(samples, 1.01 * one_rounding, one_rounding) is None
    assert not judge_close(oracle * (1 + 3 * U32), ref, oracle, "fp32", lambda: samples).passed
    assert not judge_close(oracle + 3.5 * unit, ref, oracle, "fp32", lambda: samples).passed


def test_an_end_to_end_reference_below_every_sample_is_a_lucky_draw_of_its_inherited_error():
    """parity explore --seed 0 (torch_vocab_embedding tied, bf16, summed loss, vocabulary 3 over tp 3): the
    logits at step 3, the reference 1.06 one-roundings, its samples 3.15-7.39 (1.58-3.7 over
    SAMPLES_WIDTH, not dispersed), a correct subject 5.25 (1.32x). An end-to-end reference errs beyond one
    rounding by one draw of an inherited error: below every sample's over SAMPLES_WIDTH, the smallest of
    those stands in. A stage-local check (inherits False) keeps its bound; a scale the stand-in bound
    does not hide still fails."""
    from parity.checks.tolerances import ONE_ROUNDING_RMS, SAMPLES_WIDTH, dispersed, lucky_stand_in, rms_bound

    u16 = unit_roundoff("bf16")
    n = 36
    oracle = np.linspace(8.0, 16.0, n) * np.where(np.arange(n) % 2, 1.0, -1.0)
    rms_scale = float(np.sqrt(np.mean(oracle ** 2)))
    one_rounding = ONE_ROUNDING_RMS * u16 * rms_scale
    ref = oracle + 1.06 * one_rounding * np.sign(np.sin(np.arange(n) + 0.5))
    got = oracle + 5.25 * one_rounding * np.sign(np.cos(np.arange(n) + 0.5))
    samples = np.full((ROUNDING_SAMPLES, n), one_rounding) * np.geomspace(3.15, 7.39, ROUNDING_SAMPLES)[:, None]
    assert not dispersed(samples)
    first = judge_close(got, ref, oracle, "bf16")
    assert not first.passed and first.criterion == "rms"
    lucky = judge_close(got, ref, oracle, "bf16", lambda: samples)
    assert lucky.passed, lucky
    stand_in = lucky_stand_in(samples, 1.06 * one_rounding, one_rounding, inherits=True)
    assert abs(stand_in - 3.15 * one_rounding / SAMPLES_WIDTH) < 1e-9 * one_rounding
    assert lucky.bound >= rms_bound(stand_in, u16, rms_scale)
    # Stage-local, or a reference at or above the stand-in: not lucky.
    assert lucky_stand_in(samples, 1.06 * one_rounding, one_rounding, inherits=False) is None
    assert lucky_stand_in(samples, 1.6 * one_rounding, one_rounding, inherits=True) is None
    assert not judge_close(got, ref, oracle, "bf16", lambda: samples, inherits=False).passed
    assert not judge_close(oracle * (1 + 4 * u16), ref, oracle, "bf16", lambda: samples).passed


def test_a_sample_of_values_rounded_once_errs_at_most_mca_one_rounding():
    """MCA_ONE_ROUNDING is what RoundingNoise gives a tensor rounded once (a narrowing cast): at most 1.5
    one-roundings, reached at the place in the binade s = 0.72 (mantissa 1.385), about 1.1-1.4 over
    values spread across the binade."""
    from parity.checks.tolerances import MCA_ONE_ROUNDING, ONE_ROUNDING_RMS

    u16 = unit_roundoff("bf16")
    gen = torch.Generator().manual_seed(0)
    exponents = torch.randint(-8, 8, (200_000,), generator=gen).double()
    spread = torch.exp2(exponents + torch.rand(200_000, generator=gen, dtype=torch.float64))
    worst_place = torch.exp2(exponents) * (1.37 + 0.03 * torch.rand(200_000, generator=gen, dtype=torch.float64))

    def ratio(x):
        with rounding.RoundingNoise(1):
            y = x.to(torch.bfloat16)
        one_rounding = ONE_ROUNDING_RMS * u16 * float(x.pow(2).mean().sqrt())
        return float((y.double() - x).pow(2).mean().sqrt()) / one_rounding
    assert 1.1 < ratio(spread) < MCA_ONE_ROUNDING
    assert 1.45 < ratio(worst_place) < MCA_ONE_ROUNDING * 1.01


def test_samples_beyond_one_rounding_in_their_own_units_call_a_reference_below_them_lucky():
    """parity explore --seed 0 (direct_column_gathered bf16, vocabulary 23, hidden 2, reduction none): the
    embedding gradient at step 4 (46 entries), the reference 0.45 one-roundings, its samples 1.72-3.4 (0.86-1.7
    over SAMPLES_WIDTH, not dispersed), a correct subject 2.8 (1.06x of the first bound). Every sample errs
    beyond what one rounding gives a sample (MCA_ONE_ROUNDING), so the reference below the smallest over
    SAMPLES_WIDTH is a lucky draw. bf16 weights the reference rounds almost exactly (0.05 one-roundings,
    samples 1.08-1.16) stay out, and the stand-in bound still fails a scale error."""
    from parity.checks.tolerances import (MCA_ONE_ROUNDING, ONE_ROUNDING_RMS, SAMPLES_WIDTH, dispersed,
                                          lucky_stand_in)

    u16 = unit_roundoff("bf16")
    n = 46
    oracle = np.linspace(0.5, 1.5, n) * np.where(np.arange(n) % 3, 1.0, -1.0)
    rms_scale = float(np.sqrt(np.mean(oracle ** 2)))
    one_rounding = ONE_ROUNDING_RMS * u16 * rms_scale
    ref = oracle + 0.45 * one_rounding * np.sign(np.sin(np.arange(n) + 0.5))
    got = oracle + 2.8 * one_rounding * np.sign(np.cos(np.arange(n) + 0.5))
    samples = np.full((ROUNDING_SAMPLES, n), one_rounding) * np.geomspace(1.72, 3.4, ROUNDING_SAMPLES)[:, None]
    assert not dispersed(samples) and 1.72 / SAMPLES_WIDTH < 1 < 1.72 / MCA_ONE_ROUNDING
    first = judge_close(got, ref, oracle, "bf16")
    assert not first.passed and first.criterion == "rms"
    lucky = judge_close(got, ref, oracle, "bf16", lambda: samples)
    assert lucky.passed and lucky.criterion.startswith("lucky"), lucky
    weights = np.full((ROUNDING_SAMPLES, n), one_rounding) * np.linspace(1.08, 1.16, ROUNDING_SAMPLES)[:, None]
    assert lucky_stand_in(weights, 0.05 * one_rounding, one_rounding, inherits=True) is None
    assert judge_close(got, ref, oracle, "bf16", lambda: weights).bound == first.bound
    assert not judge_close(oracle * (1 + 4 * u16), ref, oracle, "bf16", lambda: samples).passed


def test_dispersed_samples_judge_an_rms_miss_beyond_the_sampled_reach():
    """A seed sweep of the same cases in fp32 (seed 7): a one-row, 42-entry shard of the tied embedding
    gradient at step 3, the reference 16.7 one-roundings, its samples 29-1560 (spread 53), a correct
    subject 304: 4.56x of the first bound, beyond RMS_SAMPLED_REACH. Dispersed samples say one run's RMS
    error does not stand for another's however far apart, so they judge it; samples that agree leave a
    miss beyond the reach failed unsampled."""
    from parity.checks.tolerances import ONE_ROUNDING_RMS, RMS_SAMPLED_REACH, dispersed

    n = 42
    oracle = np.linspace(-1.0, 1.0, n) + 0.01
    rms_scale = float(np.sqrt(np.mean(oracle ** 2)))
    one_rounding = ONE_ROUNDING_RMS * U32 * rms_scale
    ref = oracle + 16.7 * one_rounding * np.sign(np.sin(np.arange(n) + 0.5))
    got = oracle + 304 * one_rounding * np.sign(np.cos(np.arange(n) + 0.5))
    first = judge_close(got, ref, oracle, "fp32")
    assert not first.passed and first.measured > RMS_SAMPLED_REACH * first.bound
    spread = np.full((ROUNDING_SAMPLES, n), one_rounding) * np.geomspace(29, 1560, ROUNDING_SAMPLES)[:, None]
    assert dispersed(spread)
    assert judge_close(got, ref, oracle, "fp32", lambda: spread).passed
    agree = np.full((ROUNDING_SAMPLES, n), one_rounding) * np.geomspace(300, 400, ROUNDING_SAMPLES)[:, None]
    assert not dispersed(agree)
    assert not judge_close(got, ref, oracle, "fp32", lambda: agree).passed


def test_a_one_entry_shard_is_gated_by_its_whole_tensor():
    """parity explore --seed 13 (vocab_parallel fp32, vocabulary 2 over tp 2, dp 2): a one-entry bias
    shard, oracle -0.02896, a cancelling sum of terms up to about 1. The reference erred by 2.3e-10 on
    it, the samples up to 2.44e-8 (under the floor, 16 u max|oracle| = 2.76e-8) and 3.75e-8 on the other
    entry; a correct subject 3.7e-8. The whole tensor's samples show its entries cancel, so the shard
    gets SHARDING_SLACK x its own samples' largest error; a whole within its floor changes nothing."""
    oracle, ref = np.array([-0.02896]), np.array([-0.02896 + 2.3e-10])
    got = oracle + 3.7e-8
    shard = np.linspace(0.5e-8, 2.44e-8, ROUNDING_SAMPLES)[:, None]
    first = judge_close(got, ref, oracle, "fp32")
    assert not first.passed and first.criterion == "max"

    def sampled_with(other_entry):
        def sampled():
            return shard
        sampled.whole = lambda: (np.concatenate([shard, np.full((ROUNDING_SAMPLES, 1), other_entry)], axis=1), 0.02896)
        return sampled
    assert judge_close(got, ref, oracle, "fp32", lambda: shard).bound == first.bound  # no whole: as before
    gated = judge_close(got, ref, oracle, "fp32", sampled_with(3.75e-8))
    assert gated.passed and gated.criterion == "sampled max"
    assert gated.bound == SHARDING_SLACK * 2.44e-8 + FLOOR_ULPS * U32 * 0.02896
    within = judge_close(got, ref, oracle, "fp32", sampled_with(2.5e-8))
    assert (within.passed, within.bound) == (False, first.bound)
    assert not judge_close(oracle + 2e-7, ref, oracle, "fp32", sampled_with(3.75e-8)).passed


def test_few_source_samples_widen_the_rms_slack_by_their_own_spread():
    """parity explore --seed 0 (vocab_parallel fp32, vocabulary 4 over tp 3, num_items): a one-row shard of
    the head's stage-local weight gradient, 63 entries sharing a dozen tokens' dz errors. The stage
    reference 2.02 units of u rms(oracle), its samples 2.48-5.67 (spread 2.29: not dispersed), a correct
    subject 5.95, 1.18x of RMS_SLACK x 2.02 + 1 units. Few sources make the ratio of two runs' RMS errors
    vary by the samples' spread, which sets the slack; samples that agree leave RMS_SLACK, and the wider
    bound still fails a scale of a few units and an error beyond it."""
    from parity.checks.tolerances import (DISPERSED_SPREAD, FEW_SOURCE_Z, RMS_FLOOR_ULPS, RMS_SLACK, dispersed,
                                          few_source_slack)

    n = 63
    oracle = np.linspace(1.0, 2.0, n)
    unit = U32 * float(np.sqrt(np.mean(oracle ** 2)))
    ref = oracle + 2.02 * unit * np.sign(np.sin(np.arange(n)))
    got = oracle + 5.95 * unit * np.sign(np.cos(np.arange(n)))
    samples = np.full((ROUNDING_SAMPLES, n), unit) * np.geomspace(2.48, 5.67, ROUNDING_SAMPLES)[:, None]
    assert 5.67 / 2.48 < DISPERSED_SPREAD and not dispersed(samples)
    first = judge_close(got, ref, oracle, "fp32", inherits=False)
    assert not first.passed and first.criterion == "rms"
    slack = few_source_slack(samples)
    sigma = float(np.std(np.log(np.geomspace(2.48, 5.67, ROUNDING_SAMPLES)), ddof=1))
    assert abs(slack - np.exp(FEW_SOURCE_Z * np.sqrt(2) * sigma)) < 1e-9 and slack > RMS_SLACK
    judged = judge_close(got, ref, oracle, "fp32", lambda: samples, inherits=False)
    assert judged.passed
    agree = np.full((ROUNDING_SAMPLES, n), unit) * np.geomspace(2.0, 2.6, ROUNDING_SAMPLES)[:, None]
    assert few_source_slack(agree) == RMS_SLACK and few_source_slack(None) == RMS_SLACK
    assert judge_close(got, ref, oracle, "fp32", lambda: agree, inherits=False).bound == first.bound
    beyond = oracle + 1.02 * (slack * 2.02 + RMS_FLOOR_ULPS) * unit * np.sign(np.cos(np.arange(n)))
    missed = judge_close(beyond, ref, oracle, "fp32", lambda: samples, inherits=False)
    assert not missed.passed and missed.criterion == "few-source rms"
    assert not judge_close(oracle * (1 + 12 * U32), ref, oracle, "fp32", lambda: samples, inherits=False).passed
    # Pooled over the record's steps where they are known: calm steps pull a wide one in.
    calm = [agree] * 4 + [samples]

    def sampled():
        return samples
    sampled.steps = lambda: calm
    assert few_source_slack(samples, sampled.steps) < slack
    # End to end the subject and the reference share upstream roundings: no few-source slack.
    assert judge_close(got, ref, oracle, "fp32", lambda: samples).bound == judge_close(got, ref, oracle, "fp32").bound


def test_an_element_in_a_row_that_errs_more_is_held_to_its_rows_neighbourhood():
    """parity explore --seed 3 (tied_vocab_parallel bf16, vocabulary 193, hidden 61, ZeRO 3, tp 3): the
    embedding gradient's rows are separate sums, a row looked up often erring far more than the rest
    (row RMS reference errors: median 3.6e-6, row 27 7.3e-4, the shard 1.3e-4). At (27, 50) the reference
    erred by 2.1e-5, a correct subject by 2.79e-3: 1.13x against the shard's neighbourhood, within the
    row's. A row that errs like the rest keeps the tensor's, and a single corrupted entry is still caught."""
    rows, cols = 61, 61
    gen = np.random.default_rng(0)
    oracle = gen.normal(0.0, 0.02, (rows, cols))
    ref_err = np.full((rows, cols), 3.6e-6)
    ref_err[27] = 7.3e-4
    ref_err[27, 50] = 2.1e-5
    ref = oracle + ref_err * np.sign(gen.normal(size=(rows, cols)))
    got = ref.copy()
    got[27, 50] = oracle[27, 50] + 2.79e-3
    judged = judge_close(got, ref, oracle, "bf16")
    assert judged.passed and judged.criterion in ("row element", "rms", "max")
    flat = judge_close(got.ravel(), ref.ravel(), oracle.ravel(), "bf16")  # no rows: the tensor's neighbourhood
    assert not flat.passed and flat.criterion == "element"
    calm = got.copy()
    calm[27] = ref[27] = oracle[27] + 3.6e-6
    calm[27, 50] = oracle[27, 50] + 2.79e-3
    missed = judge_close(calm, ref, oracle, "bf16")
    assert not missed.passed and missed.criterion.endswith("element") and missed.index == (27, 50)


def test_a_few_source_tensor_misses_its_max_bound_only_beyond_the_samples():
    """parity explore --seed 0 (torch_vocab_embedding tied, fp32, vocabulary 3 over tp 3): a one-row, 42-entry
    shard of the embedding gradient, the reference's largest error 5.2e-8, its samples' 1.0e-7 to 7.2e-7
    (RMS errors spread 7.4: dispersed), a correct subject 7.7e-7, 2.4x of the first max bound. The samples'
    largest error stands for the reference's; calm samples leave the bound alone, and it still fails an
    error beyond it."""
    from parity.checks.tolerances import FLOOR_ULPS, SHARDING_SLACK

    n = 42
    oracle = np.linspace(-0.11, 0.118, n)
    ref = oracle + 5.2e-8 * np.sign(np.sin(np.arange(n)))
    got = oracle + 7.67e-7 * np.sign(np.cos(np.arange(n)))
    spread = np.full((ROUNDING_SAMPLES, n), 1.0) * np.geomspace(1.0e-7, 7.2e-7, ROUNDING_SAMPLES)[:, None]
    assert not judge_close(got, ref, oracle, "fp32").passed
    assert judge_close(got, ref, oracle, "fp32", lambda: spread).passed
    calm = np.full((ROUNDING_SAMPLES, n), 1.0) * np.geomspace(5.0e-8, 6.0e-8, ROUNDING_SAMPLES)[:, None]
    assert not judge_close(got, ref, oracle, "fp32", lambda: calm).passed
    # One entry beyond SHARDING_SLACK x the samples' largest error + the floor: only the max criterion misses.
    bound = SHARDING_SLACK * 7.2e-7 + FLOOR_ULPS * U32 * 0.118
    beyond = ref.copy()
    beyond[5] = oracle[5] + 1.02 * bound
    missed = judge_close(beyond, ref, oracle, "fp32", lambda: spread)
    assert not missed.passed and missed.criterion == "sampled max"
    one_off = ref.copy()
    one_off[5] = oracle[5] + 0.98 * bound
    assert judge_close(one_off, ref, oracle, "fp32", lambda: spread).passed
