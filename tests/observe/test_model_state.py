"""The state of a model a refused setup leaves behind (parity/observe/model_state.py): modules, parameters,
ties, and the hooks registered on each module."""
import torch
from torch import nn

from parity.observe.model_state import model_state


class Engine:
    def check_inputs(self, module, args):  # a bound method, as DeepSpeed's engine registers its own
        return None


def test_a_hook_left_on_a_module_changes_the_state():
    """DeepSpeed 0.19.8's refused initialize leaves its first-forward TP data check on the model
    (ci/repro/deepspeed_rejected_initialize_leaves_forward_hook.py); the state before and after must
    differ, naming the hook."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    before = model_state(model)
    assert not any(key.startswith("hooks[") for key in before)
    handle = model.register_forward_pre_hook(Engine().check_inputs)
    after = model_state(model)
    assert after != before
    assert after["hooks[<root>]"] == ["Engine.check_inputs"]
    model[0].register_forward_hook(lambda m, a, out: None)
    assert model_state(model)["hooks[0]"] == ["test_a_hook_left_on_a_module_changes_the_state.<locals>.<lambda>"]
    handle.remove()
    assert "hooks[<root>]" not in model_state(model)
