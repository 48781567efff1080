"""One driver owns the trajectory: no subject module loops over training steps itself, and the driver's
records come out in the order the checks read them."""
import ast
from pathlib import Path

import torch

import parity.subjects.driver as driver
from parity.observe.observations import RankObservations
from references.tiny_lm import ModelSpec, build_model, capture_head_input_and_grad
from references.trajectory import TrainingSpec

SUBJECTS = Path(driver.__file__).parent


def step_loops(path: Path) -> list[str]:
    """`for ... in <anything naming steps>` loops: a training loop's outer loop."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.For) and "steps" in ast.unparse(node.iter):
            found.append(f"{path.name}:{node.lineno}: for ... in {ast.unparse(node.iter)}")
    return found


def test_no_subject_module_loops_over_steps():
    loops = [loop for path in sorted(SUBJECTS.glob("*.py")) if path.name != "driver.py" for loop in step_loops(path)]
    # loss_scaling.documented computes DeepSpeed's documented scale schedule (no training).
    assert [loop for loop in loops if not loop.startswith("loss_scaling.py")] == []
    assert step_loops(SUBJECTS / "driver.py"), "the driver's own step loop was not found: the test reads nothing"


def test_plain_run_records_every_step_in_order():
    spec, train = ModelSpec(vocab=8, hidden=4), TrainingSpec(steps=2, micro_batches=2)
    model = build_model(spec, train.seed, torch.float32)
    captured: dict = {}
    capture_head_input_and_grad(model, captured)
    obs = driver.train(driver.Run(RankObservations(0, 0, 0), train,
                                  lambda batch, n: model(**batch, num_items_in_batch=n),
                                  driver.PlainUpdate.sgd(model, torch.float32, train.lr),
                                  driver.lm_batches(train, spec, 0, "cpu"), spec.reduction, captured=captured))
    kinds = [key[:3] for key in obs.tensors if key[0] != "weight" or key[1] >= 0]
    micro = [(k, s, m) for s in range(2) for m in range(2) for k in ("logits", "loss", "head_input", "head_input_grad")]
    assert [k for k in kinds if k[2] is not None] == micro
    params = len(dict(model.named_parameters()))
    assert [k[:2] for k in kinds if k[0] == "grad"] == [("grad", 0)] * params + [("grad", 1)] * params
    assert ("weight", -1, None, "lm_head.weight") in obs.tensors and ("weight", 1, None, "lm_head.weight") in obs.tensors
    # The update applied the recorded gradient: w1 = w0 - lr * g0, bitwise in fp32.
    w0, w1 = obs.get("weight", -1, None, "lm_head.weight"), obs.get("weight", 0, None, "lm_head.weight")
    g0 = obs.get("grad", 0, None, "lm_head.weight")
    stepped = torch.tensor(w0, dtype=torch.float32) - train.lr * torch.tensor(g0, dtype=torch.float32)
    assert stepped.double().numpy().tolist() == w1.tolist()
