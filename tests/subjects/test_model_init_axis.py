"""The model_init axis (issue 13, the user's entry points): which subjects have it, that the search holds it, and
that its cases are the documented ones (zero.Init only at ZeRO 3; its explicit dtype the one divergence)."""
from parity.explore.domains import HELD_AXES
from parity.axes import AXES
from parity.matrix.cases import load
from parity.subjects import SUBJECTS

HAVING = ("column_gathered", "vocab_parallel", "tied_vocab_parallel", "hf_plan_column", "hf_plan_tied")


def test_the_engine_heads_have_it_quiet_at_plain():
    assert AXES["model_init"].default == "plain" and AXES["model_init"].quiet_default
    for name in HAVING:
        assert "model_init" in SUBJECTS[name].axes, name
    assert HELD_AXES["model_init"][0] == "plain"


def test_zero_init_cases_are_zero3_and_only_an_explicit_dtype_diverges():
    cases = [c for c in load() if c.values.optional("model_init", "plain") != "plain"]
    assert {c["model_init"] for c in cases} == {"tp_model_init", "zero_init", "zero_init_dtype"}
    for case in cases:
        if case["model_init"].startswith("zero_init"):
            assert case["zero"] == 3, case.id
        assert bool(case.divergence) == (case["model_init"] == "zero_init_dtype"), case.id
    assert {c.subject for c in cases if c["model_init"] == "zero_init"} == {"vocab_parallel", "tied_vocab_parallel"}


def test_an_hf_plan_tp_model_init_case_has_no_tensor_parallel_section_but_autotp_size():
    # What user_model leaves of the config: the section goes when only DeepSpeed's defaults remain.
    for case in (c for c in load() if c.values.optional("model_init", None) == "tp_model_init"):
        subject = SUBJECTS[case.subject]
        section = dict(subject.ds_config(case.values, subject.training_spec(case.values))["tensor_parallel"])
        del section["autotp_size"]
        assert (section == {"tp": {"tp_grain_size": 1}}) == case.subject.startswith("hf_plan_"), case.id
