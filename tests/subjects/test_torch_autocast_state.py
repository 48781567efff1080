"""The engine subjects' process-state reset covers DeepSpeed's torch_autocast globals."""
import pytest

pytest.importorskip("deepspeed")


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
