"""parity sensitivity's pieces: the perturbations do what they say, the bisection finds the threshold
a check sets, and a check of another observable never counts as catching."""
import numpy as np
import pytest

from parity import cli, sensitivity
from parity.checks import perturb
from parity.checks.compare import Check
from parity.observe.observations import RankObservations
from parity.subjects.base import Claims
from parity.subjects.values import resolve


def observations():
    obs = RankObservations(1, 1, 0)
    obs.tensors = {("weight", -1, None, "w"): np.arange(1.0, 7.0).reshape(2, 3),
                   ("weight", 0, None, "w"): np.arange(1.0, 7.0).reshape(2, 3),
                   ("logits", 0, 0, None): np.array([[1.0, -2.0, 3.0, -4.0]]),
                   ("logits", 0, 1, None): np.array([[5.0, 6.0, 7.0, 8.0]]),
                   ("loss", 0, 0, None): np.array(2.5)}
    return {0: RankObservations(0, 0, 0, dict(obs.tensors)), 1: obs}


CLAIMS = Claims(module_types={}, param_shards={"w": None}, micro_records={"logits": None, "loss": None})


def test_scale_moves_every_record_of_the_observable_on_one_rank_only():
    obs = observations()
    out = perturb.perturb(obs, 1, "logits", "scale", 0.5, CLAIMS, 2)
    assert np.array_equal(out[1].tensors[("logits", 0, 1, None)], 1.5 * obs[1].tensors[("logits", 0, 1, None)])
    assert np.array_equal(out[0].tensors[("logits", 0, 0, None)], obs[0].tensors[("logits", 0, 0, None)])
    assert np.array_equal(obs[1].tensors[("logits", 0, 0, None)], [[1.0, -2.0, 3.0, -4.0]])  # input untouched


def test_element_flips_the_median_entry_of_the_first_record():
    out = perturb.perturb(observations(), 1, "logits", "element", 2.0, CLAIMS, 2)
    assert np.array_equal(out[1].tensors[("logits", 0, 0, None)], [[1.0, -2.0, -3.0, -4.0]])
    assert np.array_equal(out[1].tensors[("logits", 0, 1, None)], [[5.0, 6.0, 7.0, 8.0]])


def test_shard_flips_the_block_this_tp_rank_owns_and_initial_weights_stay():
    out = perturb.perturb(observations(), 1, "logits", "shard", 2.0, CLAIMS, 2)
    assert np.array_equal(out[1].tensors[("logits", 0, 0, None)], [[1.0, -2.0, -3.0, 4.0]])
    out = perturb.perturb(observations(), 1, "weight", "scale", 1.0, CLAIMS, 2)
    assert np.array_equal(out[1].tensors[("weight", -1, None, "w")], np.arange(1.0, 7.0).reshape(2, 3))
    assert np.array_equal(out[1].tensors[("weight", 0, None, "w")], 2 * np.arange(1.0, 7.0).reshape(2, 3))


def test_bisection_finds_the_threshold_a_check_sets_and_ignores_other_observables():
    def judge(observable, mode, eps):
        return [Check("logits", eps <= 3e-3, measured=eps, bound=3e-3), Check("loss", eps <= 1e-6)]

    eps, by = sensitivity.threshold(judge, "logits", "scale", set())
    assert 3e-3 < eps <= 3e-3 * 1.1 and by == ["logits"]
    never = sensitivity.threshold(lambda *a: [Check("loss", False)], "logits", "scale", set())
    assert never == (None, [])


@pytest.mark.parametrize("name,observable", [("assembled[logits]", "logits"), ("loss[stage]", "loss"),
                                             ("head_input_grad[stage]", "head_input_grad"),
                                             ("grad[lm_head.weight]", "weight_grad"), ("sgd_update[w]", "weight"),
                                             ("logits[stage]", "logits"),
                                             ("grad[lm_head.weight][stage]", "weight_grad")])
def test_checks_belong_to_their_observable(name, observable):
    assert sensitivity.belongs(name, observable)
    assert not sensitivity.belongs(name, "loss" if observable != "loss" else "logits")


def test_an_empty_selection_is_a_one_line_usage_error(capsys):
    assert cli.main(["sensitivity", "--case", "ds_reject-vocab_empty_shard-tp2-cpu", "--report", "/tmp/x"]) == 2
    assert "no parity cases selected" in capsys.readouterr().err


def test_a_known_divergence_is_measured_on_the_checks_its_mark_does_not_explain(monkeypatch):
    from types import SimpleNamespace

    from parity.matrix.cases import KnownDivergence as Divergence

    original = observations()

    def compare(subject, values, obs, reference, oracle, collectives):
        got, want = obs[1].tensors[("logits", 0, 1, None)], original[1].tensors[("logits", 0, 1, None)]
        error = float(np.max(np.abs(got / want - 1)))
        return [Check("contract[grad]", False, rank=1), Check("logits", error <= 1e-3, measured=error, bound=1e-3)]

    monkeypatch.setattr(sensitivity, "compare", compare)
    monkeypatch.setattr(sensitivity, "reference_pair", lambda subject, values: (None, None))
    fake = SimpleNamespace(name="fake", axes={"dtype": None, "tp": None}, defaults={}, claims=lambda values: CLAIMS)
    monkeypatch.setitem(sensitivity.SUBJECTS, "fake", fake)
    case = SimpleNamespace(id="fake-case", subject="fake", values=resolve(fake, {"dtype": "bf16", "tp": 2}),
                           collectives=(),
                           divergence=Divergence(reason="r", repro="ci/repro/x.py", checks=("contract",)))
    entry = sensitivity.measure_case(case, SimpleNamespace(observations=observations()))
    assert entry["baseline_failed"] == [] and entry["divergence_failed"] == ["contract[grad]"]
    assert 1e-3 < entry["thresholds"]["logits/scale"]["eps"] <= 1.1e-3
    case.divergence = Divergence(reason="r", repro="ci/repro/x.py", checks=("loss",))  # explains nothing here
    assert sensitivity.measure_case(case, SimpleNamespace(observations=observations()))["baseline_failed"] == [
        "contract[grad]"]
