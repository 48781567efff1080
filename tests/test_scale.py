"""The scale cases (parity/scale/): the case file, and that every stage check can fail.

At production shapes the checks run on the ranks and only reductions come back, so the proof that a
verdict can fail is made here, on CPU ranks at small shapes through the same code: each planted
error (parity/scale/subjects.py, PLANTS) must fail its own stage, and the clean twins must pass."""
import pytest

from parity.scale import cases as scale_cases
from parity.scale.run import judge, spawn
from parity.scale.subjects import PLANTS

SMALL = {"hidden": 16, "tokens": 64, "tp": 2, "lr": 0.05, "samples": 8, "seed": 7, "device": "cpu"}
FUSED_PLANTS = ("loss", "hidden_grad", "update")
GATHERED_PLANTS = ("logits", "dlogits", "weight_grad")


def _cases():
    groups = [
        {"subject": "vocab_parallel", "backend": "torch", "dtype": ["bf16", "fp32"], "vocab": 128},
        {"subject": "vocab_parallel", "backend": "torch", "dtype": "bf16", "vocab": 128, "plant": list(PLANTS)},
        {"subject": "fused_linear_ce", "dtype": "fp32", "vocab": 128},
        {"subject": "fused_linear_ce", "dtype": "fp32", "vocab": 128, "plant": list(FUSED_PLANTS)},
        {"subject": "column_gathered", "dtype": "bf16", "vocab": 128},
        {"subject": "column_gathered", "dtype": "bf16", "vocab": 128, "plant": list(GATHERED_PLANTS)},
    ]
    return scale_cases.expand({"defaults": SMALL, "group": groups})


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    cases = _cases()
    by_case, problems = spawn(cases, tmp_path_factory.mktemp("scale"), timeout_s=300)
    assert problems == []
    return {c["id"]: (c, judge(c, by_case.get(c["id"])), by_case.get(c["id"])) for c in cases}


def test_clean_cases_pass(verdicts):
    clean = {i: v for i, (c, v, _) in verdicts.items() if not c.get("plant")}
    assert len(clean) == 4
    assert {i: v["verdict"] for i, v in clean.items()} == {i: "passed" for i in clean}


def test_every_planted_error_fails_its_own_stage(verdicts):
    planted = [(c, v, ranks) for c, v, ranks in verdicts.values() if c.get("plant")]
    assert len(planted) == len(PLANTS) + len(FUSED_PLANTS) + len(GATHERED_PLANTS)
    for c, v, ranks in planted:
        assert v["verdict"] == "caught", (c["id"], v["why"])


def test_the_bench_shapes_are_scale_cases():
    ids = {c["id"] for c in scale_cases.load()}
    for backend in ("torch", "liger"):
        for tokens in (8192, 16384):
            assert f"vocab_parallel-{backend}-bf16-V32000-H4096-T{tokens}-tp2" in ids


def test_a_plant_that_fails_another_stage_is_missed():
    case = {**_cases()[0], "plant": "loss"}
    rows = [{"stage": "loss (mean)", "passed": True, "worst_ratio": 0.1, "over_bound": 0, "checked": 1},
            {"stage": "dlogits (every element)", "passed": False, "worst_ratio": 3.0, "over_bound": 1, "checked": 9}]
    ranks = [{"rank": r, "facts": {"loss_backend": ["torch"]}, "rows": rows} for r in range(2)]
    assert judge(case, ranks)["verdict"] == "missed"


def test_wrong_liger_backend_is_a_failure():
    case = scale_cases.expand({"defaults": {**SMALL, "device": "cuda"},
                               "group": [{"subject": "vocab_parallel", "backend": "liger", "dtype": "bf16",
                                          "vocab": 128}]})[0]
    ranks = [{"rank": r, "facts": {"loss_backend": ["torch"]}, "rows": []} for r in range(2)]
    v = judge(case, ranks)
    assert v["verdict"] == "failed" and "expected ['liger']" in v["why"]


@pytest.mark.parametrize("group, message", [
    ({"subject": "nope", "dtype": "bf16", "vocab": 8}, "bad value subject = 'nope'"),
    ({"subject": "vocab_parallel", "backend": "torch", "dtype": "fp64", "vocab": 8}, "bad value dtype = 'fp64'"),
    ({"subject": "vocab_parallel", "backend": "torch", "dtype": "bf16", "vocab": "8"}, "vocab = '8' must be int"),
    ({"subject": "vocab_parallel", "dtype": "bf16", "vocab": 8}, "backend = None is not one of"),
    ({"subject": "fused_linear_ce", "dtype": "bf16", "vocab": 8, "colour": 1}, "unknown key 'colour'"),
])
def test_bad_case_file_values_are_one_line_errors(group, message):
    with pytest.raises(scale_cases.ScaleCaseError, match=message.replace("(", r"\(").replace("[", r"\[")) as err:
        scale_cases.expand({"defaults": SMALL, "group": [group]}, "x.toml")
    assert "\n" not in str(err.value) and str(err.value).startswith("x.toml: [[group]] #1")


def test_a_nan_is_over_any_bound():
    import torch

    from parity.scale.stages import Tally

    t = Tally("x")
    t.add(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 1.0], dtype=torch.float64),
          torch.tensor([1.0, 1e9], dtype=torch.float64))
    assert t.row()["over_bound"] == 1 and not t.row()["passed"]


def test_an_empty_stage_does_not_pass():
    import torch

    from parity.scale.stages import Tally

    t = Tally("x")
    t.add(torch.zeros(0), torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64))
    assert not t.row()["passed"]


def test_sum_bound_is_the_smaller_of_worst_case_and_probabilistic():
    from parity.checks import tolerances as tol

    u = tol.unit_roundoff("fp32")
    assert tol.gamma(2, u) == pytest.approx(2 * u, rel=1e-6)  # a TP=2 sum: the worst case is smaller
    assert tol.gamma(256000, u) < 256000 * u / 30  # a vocabulary sum: the probabilistic one, 30x+ tighter
