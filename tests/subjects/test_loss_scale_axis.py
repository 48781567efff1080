"""The loss_scale axis: DeepSpeed's documented schedule as the suite states it, the config it writes, where it is
refused, and what the reference is told (cases/deepspeed_loss_scale.toml)."""
from parity.matrix.cases import CASES_DIR, load_file
from parity.subjects import SUBJECTS
from parity.subjects.loss_scaling import LOSS_SCALES, documented, fp16_section, invalid_reason
from parity.subjects.values import resolve

CASES = load_file(CASES_DIR / "deepspeed_loss_scale.toml")


def head_values(**axes):
    """A column_gathered case's values: the engine head with the loss_scale axis."""
    return resolve(SUBJECTS["column_gathered"], axes)


def test_documented_schedule():
    assert documented(LOSS_SCALES["dyn19_h1"], 5) == {
        "loss_scales": [2.0 ** 19] + [2.0 ** 18] * 4, "skipped": [0], "skipped_steps": 1}
    # hysteresis 2: the first overflow keeps the scale, the second halves it
    assert documented(LOSS_SCALES["dyn19"], 5)["skipped"] == [0, 1]
    # window 2: doubled after two clean steps, overflowing again there
    assert documented(LOSS_SCALES["dyn19_h1_w2"], 5) == {
        "loss_scales": [2.0 ** 19, 2.0 ** 18, 2.0 ** 18, 2.0 ** 19, 2.0 ** 18], "skipped": [0, 3], "skipped_steps": 2}
    assert documented(LOSS_SCALES["dyn10_w1"], 5)["loss_scales"] == [2.0 ** p for p in range(10, 15)]


def test_config_and_reference():
    assert fp16_section(head_values(loss_scale="static")) == {"enabled": True, "loss_scale": 1.0}
    assert fp16_section(head_values(loss_scale="dyn19")) == {"enabled": True, "loss_scale": 0, "initial_scale_power": 19,
                                                     "loss_scale_window": 1000, "hysteresis": 2}
    case = next(c for c in CASES if c.id.endswith("ls_dyn19_h1_w2"))
    spec = SUBJECTS[case.subject].training_spec(case.values)
    assert spec.loss_scale.init_scale == 2.0 ** 19 and spec.loss_scale.growth_interval == 2


def test_refused_away_from_its_designed_point():
    values = head_values(dtype="fp16", vocab=34, hidden=32, reduction="mean", loss_scale="dyn19_h1")
    assert invalid_reason(values) is None
    assert "vocab" in invalid_reason(values.replace(vocab=35))
    assert "dtype" in invalid_reason(values.replace(dtype="bf16"))
    assert invalid_reason(values.replace(vocab=35, loss_scale="static")) is None


def test_every_case_is_fp16_and_needs_the_capability():
    assert len(CASES) == 12
    for case in CASES:
        subject = SUBJECTS[case.subject]
        assert case.values["dtype"] == "fp16" and "cpu_fp16" in subject.requires(case.values)
