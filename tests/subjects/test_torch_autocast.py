"""The engine subjects' process-state reset covers DeepSpeed's torch_autocast globals."""
from importlib.util import find_spec

from tests.conftest import skip_or_fail

if find_spec("deepspeed") is None:  # said, and a failure under PARITY_STRICT=1, as every skip here
    skip_or_fail("deepspeed is not installed (requirements-cpu.txt pins it)")


def test_reset_clears_the_torch_autocast_globals_a_previous_engine_left():
    import torch
    from deepspeed.runtime import torch_autocast

    from parity.subjects.deepspeed_autotp import CLEAN_STATE, deepspeed_process_state, reset_deepspeed_state

    # What init_autocast_params leaves after any torch_autocast engine, destroyed or not
    # (ci/repro/deepspeed_torch_autocast_state_leaks.py): the snapshot must see it, the reset must clear it.
    torch_autocast.TORCH_AUTOCAST_INITIALIZED, torch_autocast.TORCH_AUTOCAST_DTYPE = True, torch.bfloat16
    try:
        leaked = deepspeed_process_state()
        assert leaked["torch_autocast_initialized"] is True and leaked["torch_autocast_dtype"] == "torch.bfloat16"
        assert leaked != CLEAN_STATE
        assert reset_deepspeed_state() == CLEAN_STATE
        assert not torch_autocast.is_autocast_initialized() and torch_autocast.get_autocast_dtype() is None
    finally:
        torch_autocast.TORCH_AUTOCAST_INITIALIZED, torch_autocast.TORCH_AUTOCAST_DTYPE = False, None


def test_autocast_axis_is_quiet_and_reaches_the_engine_config_and_its_decision_record():
    from parity.axes import AXES
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve
    from references.trajectory import TrainingSpec

    assert AXES["autocast"].quiet_default and AXES["autocast"].default == "off"
    subject = SUBJECTS["vocab_parallel"]
    values = resolve(subject, {"backend": "torch", "dtype": "fp32", "reduction": "mean", "vocab": 34, "hidden": 32,
                               "bias": True, "head": "lm_head", "ignore": "scattered", "zero": 1, "gas": 2, "tp": 2,
                               "dp": 1, "device": "cpu"})
    off, on = values, values.replace(autocast="bf16")
    train = TrainingSpec()
    assert "torch_autocast" not in subject.ds_config(off, train)
    assert subject.ds_config(on, train)["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    # rank_decisions holds each rank to what the engine says it autocasts to: None when the axis is off.
    assert subject.decided(off)["torch_autocast"] is None
    assert subject.decided(on)["torch_autocast"] == "torch.bfloat16"
    # A reference shared between cases must not be shared across the axis; off keeps the old key.
    assert subject.reference_key(off) == ("train_reference", subject.model_spec(off), subject.training_spec(off), "fp32")
    assert subject.reference_key(on) != subject.reference_key(off)


def test_stage_references_compute_in_the_autocast_dtype():
    from parity.checks.compare import Comparison
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve

    subject = SUBJECTS["vocab_parallel"]
    values = resolve(subject, {"backend": "torch", "dtype": "fp32", "reduction": "mean", "vocab": 34, "hidden": 32,
                               "bias": False, "head": "lm_head", "ignore": "scattered", "zero": 0, "gas": 2, "tp": 2,
                               "dp": 1, "device": "cpu"})
    assert Comparison(subject, values, {}, None, None).stage_dtype == "fp32"
    assert Comparison(subject, values.replace(autocast="bf16"), {}, None, None).stage_dtype == "bf16"


def test_zero_reduce_dtypes_decision_follows_the_config_and_the_autocast_marks():
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve

    subject = SUBJECTS["column_gathered"]
    base = resolve(subject, {"dtype": "bf16", "reduction": "mean", "vocab": 34, "hidden": 32, "bias": True,
                             "head": "lm_head", "ignore": "scattered", "gas": 2, "tp": 2, "dp": 1, "device": "cpu"})
    # communication_data_type fp32 under ZeRO 1/2: one fp32 bucket, fresh process or not (the after_autocast
    # cases fail here: the leftover globals give bf16).
    for zero in (1, 2):
        for process in ("fresh", "after_autocast"):
            values = base.replace(zero=zero, dp_reduce="comm_fp32", process=process)
            assert subject.decided(values)["zero_reduce_dtypes"] == ["torch.float32"]
    # torch_autocast's marks: proj's bucket in bf16, the rest in fp32; ZeRO 3 builds its buckets from the same marks.
    for zero in (1, 2, 3):
        on = base.replace(dtype="fp32", zero=zero, autocast="bf16")
        assert subject.decided(on)["zero_reduce_dtypes"] == ["torch.bfloat16", "torch.float32"]
    # No bucket to speak of without ZeRO, and no claim on the defaults.
    assert "zero_reduce_dtypes" not in subject.decided(base.replace(zero=0, dp_reduce="comm_fp32"))
    assert "zero_reduce_dtypes" not in subject.decided(base.replace(zero=2))


def test_autocast_modules_names_the_head_class_the_subject_claims_and_the_decision_follows():
    from parity.axes import AXES
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve
    from references.trajectory import TrainingSpec

    assert AXES["autocast_modules"].quiet_default and AXES["autocast_modules"].default == "default"
    base = {"dtype": "fp32", "reduction": "mean", "vocab": 35, "hidden": 32, "bias": False, "head": "lm_head",
            "ignore": "scattered", "zero": 2, "gas": 2, "tp": 2, "dp": 2, "device": "cpu", "backend": "torch",
            "autocast": "bf16"}
    for name, head_class in (("vocab_parallel", "VocabParallelLinear"), ("column_gathered", "LinearLayer"),
                             ("row_parallel", "LinearAllreduceWithReplicatedInput")):
        subject = SUBJECTS[name]
        values = resolve(subject, {a: v for a, v in base.items() if a in subject.axes})  # row_parallel: no backend
        named = values.replace(autocast_modules="head")
        section = subject.ds_config(named, TrainingSpec())["torch_autocast"]
        # The class by the full name DeepSpeed imports it by, and nn.Linear kept for the replicated proj.
        assert section["lower_precision_safe_modules"] == ["torch.nn.modules.linear.Linear",
                                                           f"deepspeed.module_inject.layers.{head_class}"]
        assert subject.claims(named).module_types["lm_head"] == head_class
        assert subject.decided(named)["head_comm_dtype"] == "torch.bfloat16"
        # DeepSpeed's default list: the head (no longer an nn.Linear) is unmarked; the section names no list.
        assert "lower_precision_safe_modules" not in subject.ds_config(values, TrainingSpec())["torch_autocast"]
        assert subject.decided(values)["head_comm_dtype"] == "None"
        assert subject.invalid(named.replace(autocast="off")) is not None
        assert subject.invalid(named) is None
    assert "autocast_modules" not in SUBJECTS["tied_vocab_parallel"].axes


def test_autocast_modules_base_names_the_autotp_base_class_and_still_asks_for_the_head():
    import deepspeed.module_inject.layers as layers

    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve
    from references.trajectory import TrainingSpec

    base = {"dtype": "fp32", "reduction": "mean", "vocab": 35, "hidden": 32, "bias": False, "head": "lm_head",
            "ignore": "scattered", "zero": 2, "gas": 2, "tp": 2, "dp": 2, "device": "cpu", "backend": "torch",
            "autocast": "bf16", "autocast_modules": "base"}
    for name, named_class in (("vocab_parallel", "LinearLayer"), ("column_gathered", "LinearLayer"),
                              ("row_parallel", "LinearAllreduce")):
        subject = SUBJECTS[name]
        values = resolve(subject, {a: v for a, v in base.items() if a in subject.axes})  # row_parallel: no backend
        section = subject.ds_config(values, TrainingSpec())["torch_autocast"]
        assert section["lower_precision_safe_modules"] == ["torch.nn.modules.linear.Linear",
                                                           f"deepspeed.module_inject.layers.{named_class}"]
        # The named class is one the head's class derives from (or is): the documentation's "modules" cover it.
        head_class = getattr(layers, subject.claims(values).module_types["lm_head"])
        assert issubclass(head_class, getattr(layers, named_class))
        assert subject.decided(values)["head_comm_dtype"] == "torch.bfloat16"


def test_fp16_autocast_configures_float16_and_the_user_loop_scales_as_deepspeed_s_grad_scaler():
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve
    from parity.subjects.loss_scaling import AUTOCAST_FP16_SCALING

    subject = SUBJECTS["column_gathered"]
    values = resolve(subject, {"dtype": "fp32", "reduction": "sum", "vocab": 35, "hidden": 32, "bias": False,
                               "head": "lm_head", "ignore": "scattered", "zero": 1, "gas": 1, "tp": 2, "dp": 1,
                               "device": "cpu", "autocast": "fp16"})
    train = subject.training_spec(values)
    assert subject.ds_config(values, train)["torch_autocast"] == {"enabled": True, "dtype": "float16"}
    # torch.amp.GradScaler's defaults, which DeepSpeed builds and the config cannot change.
    assert train.loss_scale == AUTOCAST_FP16_SCALING and AUTOCAST_FP16_SCALING.init_scale == 2.0 ** 16
    assert subject.training_spec(values.replace(autocast="bf16")).loss_scale is None
    assert subject.decided(values)["zero_reduce_dtypes"] == ["torch.float16", "torch.float32"]
    # The point the overflow cases use: torch's AMP loop skips step 0 there, and the oracle follows it.
    import torch

    amp = subject.reference(values)
    oracle = subject.reference(values, torch.float64)
    skipped = {k[1] for k, v in amp.records.items() if k[0] == "step_skipped" and float(v) == 1.0}
    assert skipped == {0}
    assert {k[1] for k, v in oracle.records.items() if k[0] == "step_skipped" and float(v) == 1.0} == skipped
