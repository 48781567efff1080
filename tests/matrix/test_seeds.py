"""The seed axis: seed 0 is the matrix as it was (ids and numbers), another seed draws other initial
weights and data on both sides, and a seeded id can be asked for by name."""
import pytest

from parity.checks.compare import reference_pair
from parity.matrix.cases import CaseFileError, SelectionError, at_seed, at_seeds, load, load_file, seed_list, select
from parity.subjects import SUBJECTS

TRAINING = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
LOSS_ONLY = "ds_vocab_ce-fp32-mean-v35-ign_scattered-tp2-cpu"


@pytest.fixture(scope="module")
def cases():
    return {c.id: c for c in load()}


def test_the_default_seed_leaves_every_id_alone(cases):
    assert all("seed" not in c.id.split("-")[-1] for c in cases.values())
    assert all(c.values["seed"] == 0 for c in cases.values())
    assert at_seed(cases[TRAINING], 0).id == TRAINING


def test_a_seed_is_named_last_in_the_id_and_selectable_by_it(cases):
    seeded = at_seed(cases[TRAINING], 3)
    assert seeded.id == TRAINING + "-seed3" and seeded.values["seed"] == 3
    assert select(list(cases.values()), None, [seeded.id]) == [seeded]
    with pytest.raises(SelectionError, match="no case with id"):
        select(list(cases.values()), None, [TRAINING + "-seedx"])


def test_seeds_run_seed_major(cases):
    picked = [cases[TRAINING], cases[LOSS_ONLY]]
    assert [(c.id.split("-")[0], c.values["seed"]) for c in at_seeds(picked, seed_list(None, 2))] == [
        ("column_gathered", 0), ("ds_vocab_ce", 0), ("column_gathered", 1), ("ds_vocab_ce", 1)]
    assert seed_list(7, None) == [7] and seed_list(None, None) is None
    with pytest.raises(SelectionError, match="--seed and --seeds"):
        seed_list(1, 2)


@pytest.mark.parametrize("case_id", [TRAINING, LOSS_ONLY])
def test_another_seed_draws_other_weights_and_data(cases, case_id):
    case = cases[case_id]
    subject = SUBJECTS[case.subject]
    base, again, other = (reference_pair(subject, at_seed(case, s).values)[0] for s in (0, 0, 1))
    key = next(iter(base.records))
    assert (base.records[key] == again.records[key]).all()
    assert not all((base.records[k] == other.records[k]).all() for k in base.records)
    # the subject builds from the same seed as its reference (a subject reading its own constant would not)
    assert subject.training_spec(at_seed(case, 1).values).seed != subject.training_spec(case.values).seed


def test_a_divergence_limited_by_where_marks_only_those_cases(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text("""
[[matrix]]
subject = "vocab_parallel"
[matrix.axes]
dtype = ["fp32", "bf16"]
zero = [0, 2]
[[matrix.known_divergence]]
where = { dtype = ["bf16"], zero = [0] }
reason = "r"
repro = "ci/repro/deepspeed_zero0_low_precision_grad_dtype.py"
checks = ["contract[grad]"]
""")
    marked = {(c["dtype"], c["zero"]): c.divergence is not None for c in load_file(path)}
    assert marked == {("fp32", 0): False, ("fp32", 2): False, ("bf16", 0): True, ("bf16", 2): False}
    path.write_text(path.read_text().replace("zero = [0] }", "stage = [0] }"))
    with pytest.raises(CaseFileError, match=r"known_divergence\[0\]\.where\[0\]\.stage: unknown axis"):
        load_file(path)
