"""ds_reject and inference_head: cheap checks that need no rank process."""
from parity.axes import AXES, REJECTIONS
from parity.matrix.cases import CASES_DIR, load_file
from parity.subjects import SUBJECTS
from parity.subjects.deepspeed_rejects import CE_VARIANTS, ENGINE_VARIANTS, VARIANTS


def test_every_rejection_has_a_case_that_expects_an_error():
    cases = load_file(CASES_DIR / "deepspeed_rejects.toml")
    covered = {c["variant"] for c in cases}
    assert covered == set(REJECTIONS) - {"none"} == set(ENGINE_VARIANTS) | set(CE_VARIANTS)
    # The axis (parity/axes.py) and the subject list the same names in the same order; the
    # subject may not import the matrix (tests/test_layers.py), so the check lives here.
    assert VARIANTS == REJECTIONS
    for c in cases:
        assert c.expect.is_error and c.expect.match, c.id
        # ZeRO 2 and 3 refuse a DP pre-scaling option with a bare assert (stage_1_and_2.py:350-351; under
        # python -O it vanishes and the option is ignored: measured at parity, docs/inventory.md). The heuristic
        # parser refuses a model it cannot place with a bare assert too (module_inject/auto_tp.py:300). An eager
        # forward after engine.compile() with the autotp pass raises RuntimeError (layers.py:433-439). torch_autocast
        # refuses ZeRO 3's quantized weights with a bare assert (runtime/torch_autocast.py:32).
        assert c.expect.error in ("ValueError", "NotImplementedError") or (
            c.expect.error == "AssertionError"
            and c["variant"].startswith(("zero2_", "zero3_", "heuristic_", "autocast_zero_"))) or (
            c.expect.error == "RuntimeError" and c["variant"].startswith("compile_autotp_")), c.id


def test_variant_axis_is_quiet_so_no_other_id_changes():
    assert AXES["variant"].quiet_default and AXES["variant"].default == "none"
    assert all("variant" not in s.axes for name, s in SUBJECTS.items() if name != "ds_reject")


def test_inference_head_claims_the_legacy_head():
    cases = load_file(CASES_DIR / "deepspeed_inference.toml")
    assert cases and all(not c.expect.is_error for c in cases)
    claims = SUBJECTS["inference_head"].claims(cases[0].values)
    assert claims.module_types["lm_head"] == "LmHeadLinearAllreduce"
    assert claims.param_shards["lm_head.weight"] == 1 and claims.micro_records == {"logits": None}


def test_user_tp_group_variants_run_at_world_tp_times_dp():
    # The user's strided groups only differ from DeepSpeed's consecutive mesh when there is a DP dimension.
    cases = [c for c in load_file(CASES_DIR / "deepspeed_rejects.toml") if c["variant"].startswith("user_tp_group_")]
    assert {c["variant"] for c in cases} == {"user_tp_group_tp_model_init", "user_tp_group_config", "user_tp_group_mpu"}
    assert all(c.world_size == 4 and c["tp"] == 2 and c.divergence for c in cases)
    others = [c for c in load_file(CASES_DIR / "deepspeed_rejects.toml") if not c["variant"].startswith("user_")]
    assert all(c.world_size == c["tp"] for c in others)


def test_reset_clears_tp_model_init_record():
    # DeepSpeed never clears tp_model_init's module-global record: the reset must, and the state must show it.
    from deepspeed.runtime.tensor_parallel import init_utils

    from parity.subjects.deepspeed_autotp import CLEAN_STATE, deepspeed_process_state, reset_deepspeed_state

    init_utils.record_tp_model_init_args(tp_size=2, dtype=None, tp_group=None, dist_module=None)
    try:
        assert deepspeed_process_state()["tp_model_init_recorded"] is True
        assert reset_deepspeed_state() == CLEAN_STATE
    finally:
        init_utils._TP_MODEL_INIT_ARGS = None


def test_inference_tp_source_is_quiet_and_its_mpu_cases_are_the_documented_divergence():
    assert AXES["tp_source"].quiet_default and AXES["tp_source"].default == "tp_size"
    assert [n for n, s in SUBJECTS.items() if "tp_source" in s.axes] == ["inference_head"]
    cases = [c for c in load_file(CASES_DIR / "deepspeed_inference.toml") if c.values.optional("tp_source", None) == "mpu"]
    assert cases and all(c.divergence.repro == "ci/repro/deepspeed_inference_user_tp_group_ignored.py" for c in cases)


def test_a_second_inference_engine_runs_on_the_first_ones_ranks_with_its_own_claims():
    subject = SUBJECTS["inference_head"]
    cases = [c for c in load_file(CASES_DIR / "deepspeed_inference.toml") if c.values.optional("prior_tp", 0)]
    assert {(c.values["tp"], c.values["prior_tp"]) for c in cases} == {(2, 2), (2, 4)}
    for case in cases:
        assert case.world_size == case.values["prior_tp"]
        after_larger = case.values["prior_tp"] > case.values["tp"]
        assert (case.divergence is not None) == after_larger
        if after_larger:
            assert case.divergence.repro == "ci/repro/deepspeed_inference_cached_tp_group.py"
        # every copy of tp's layout is fed the one input, so each has the same reference logits
        reference = subject.reference(case.values)
        copies = [reference.get("logits", 0, 0, d, None) for d in range(case.world_size // case.values["tp"])]
        assert all((c == copies[0]).all() for c in copies)
    base = cases[0].values
    assert "no multiple" in subject.invalid(base.replace(tp=3, prior_tp=4))
    assert "mpu" in subject.invalid(base.replace(prior_tp=4, tp_source="mpu"))
    assert subject.world_size(base.replace(prior_tp=0)) == base["tp"]


def test_inference_tp_size_below_the_world_is_a_fresh_group_and_its_documented_crash():
    # dp > 1: tp_size 2 on 4 ranks, the engine's own new_group(range(tp_size)); claims of two tp-2 copies.
    subject = SUBJECTS["inference_head"]
    cases = [c for c in load_file(CASES_DIR / "deepspeed_inference.toml") if c.values.optional("dp", 1) > 1]
    assert [(c.values["tp"], c.values["dp"], c.world_size) for c in cases] == [(2, 2, 4)]
    case = cases[0]
    assert case.divergence.repro == "ci/repro/deepspeed_inference_tp_size_below_world.py"
    assert case.divergence.raises.startswith("AssertionError: AutoTP shard sizes")
    reference = subject.reference(case.values)
    assert (reference.get("logits", 0, 0, 0, None) == reference.get("logits", 0, 0, 1, None)).all()
    assert subject.invalid(case.values.replace(prior_tp=4))
    assert subject.invalid(case.values.replace(tp_source="mpu"))
