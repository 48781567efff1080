"""The reference's dynamic loss scaling is torch.amp.GradScaler's, and a skipped step changes nothing."""
import torch

from references.grad_scaler import DynamicScaling, ScalerState
from references.tiny_lm import ModelSpec
from references.trajectory import TrainingSpec, train_reference

# The loss_scale cases' model (parity/subjects/loss_scaling.py DESIGNED_POINT): step 0 overflows fp16 at 2**19.
SPEC = ModelSpec(vocab=34, hidden=32, bias=True, reduction="mean")


def test_scale_update_is_grad_scalers_kernel():
    pattern = [True, False, False, True, False, False, False, True, True, False]
    for interval in (1, 2, 3):
        ours = ScalerState(DynamicScaling(init_scale=2.0 ** 10, growth_interval=interval))
        scale, tracker = torch.tensor([2.0 ** 10]), torch.tensor([0], dtype=torch.int32)
        for found_inf in pattern:
            ours.update(found_inf)
            torch._amp_update_scale_(scale, tracker, torch.tensor([float(found_inf)]), 2.0, 0.5, interval)
            assert ours.scale == float(scale) and ours.tracker == int(tracker)


def _steps(traj, kind):
    return [float(traj.get(kind, s, None, None, None)) for s in range(5)]


def test_overflowing_step_is_skipped_and_the_oracle_follows():
    train = TrainingSpec(loss_scale=DynamicScaling(init_scale=2.0 ** 19, growth_interval=1000))
    ref = train_reference(SPEC, train, torch.float16)
    oracle = train_reference(SPEC, train, torch.float16, torch.float64)
    assert _steps(ref, "step_skipped") == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert _steps(ref, "loss_scale") == [2.0 ** 19] + [2.0 ** 18] * 4
    assert _steps(oracle, "step_skipped") == _steps(ref, "step_skipped")
    for traj in (ref, oracle):
        for name in ("lm_head.weight", "proj.weight", "embed_tokens.weight"):
            assert torch.equal(traj.get("weight", 0, None, None, name), traj.get("weight", -1, None, None, name))
            assert not torch.equal(traj.get("weight", 1, None, None, name), traj.get("weight", 0, None, None, name))
    assert ref.layouts[("head_input_grad", 0, 0, 0, None)][0] == "float16"  # the dtype plain torch held it in


def test_without_overflow_the_oracle_is_the_unscaled_one():
    """Where the fp16 run skips nothing the float64 oracle, which takes no scale, is the unscaled oracle bitwise."""
    scaled = TrainingSpec(loss_scale=DynamicScaling(init_scale=2.0 ** 10, growth_interval=2))
    plain = train_reference(SPEC, TrainingSpec(), torch.float16, torch.float64)
    oracle = train_reference(SPEC, scaled, torch.float16, torch.float64)
    assert _steps(oracle, "step_skipped") == [0.0] * 5
    for key, value in plain.records.items():
        assert torch.equal(oracle.records[key], value), key
