"""partition_config options (issue 13): what each case hands DeepSpeed and what it claims, without a rank.

The configs are read back with re.match, as AutoTPConfig.matches does (module_inject/autotp_config.py), so
no DeepSpeed import is needed and the test stays fast.
"""
import re

from parity.explore.domains import HELD_AXES
from parity.matrix.cases import CASES_DIR, load_file
from parity.subjects import SUBJECTS
from parity.subjects.deepspeed_rejects import ENGINE_VARIANTS

HEADS = load_file(CASES_DIR / "deepspeed_heads.toml")
REJECTS = load_file(CASES_DIR / "deepspeed_rejects.toml")


def _values(subject, **axes):
    from parity.subjects.values import resolve

    return resolve(SUBJECTS[subject], axes)


def _spec_for(partition_config: dict, param: str):
    found = [s for s in partition_config["layer_specs"] if any(re.match(p, param) for p in s["patterns"])]
    return found[0] if found else None


def _cases(cases, axis, value):
    return [c for c in cases if c.values.optional(axis, None) == value]


def test_use_default_specs_sets_only_its_own_key_and_claims_the_same_model():
    subject = SUBJECTS["column_gathered"]
    configs = {v: subject.tensor_parallel_config(_values("column_gathered", use_default_specs=v))["partition_config"]
               for v in ("false", "unset", "true")}
    assert configs["false"]["use_default_specs"] is False and configs["true"]["use_default_specs"] is True
    assert "use_default_specs" not in configs["unset"]  # DeepSpeed's own default (true) decides
    assert configs["false"]["layer_specs"] == configs["unset"]["layer_specs"] == configs["true"]["layer_specs"]
    assert "preset_model" not in subject.tensor_parallel_config(_values("column_gathered", use_default_specs="unset"))
    claims = {v: subject.claims(_values("column_gathered", use_default_specs=v)) for v in configs}
    assert claims["false"] == claims["unset"] == claims["true"]
    cases = [c for c in HEADS if c.values.optional("use_default_specs", "false") != "false"]
    assert {c["use_default_specs"] for c in cases} == {"unset", "true"}
    assert all(c.divergence is None and not c.expect.is_error and c.collectives for c in cases)  # parity, pinned


def test_grad_allreduce_marks_proj_only_and_is_a_known_divergence():
    subject = SUBJECTS["column_gathered"]
    on = subject.tensor_parallel_config(_values("column_gathered", grad_allreduce=True))["partition_config"]
    off = subject.tensor_parallel_config(_values("column_gathered"))["partition_config"]
    assert _spec_for(on, "proj.weight") == {"patterns": [r"proj\.weight$"], "partition_type": "skip",
                                            "grad_allreduce": True}
    assert not _spec_for(on, "lm_head.weight").get("grad_allreduce") and _spec_for(on, "proj.bias") is None
    assert "grad_allreduce" not in _spec_for(off, "proj.weight")
    # The claims (and the reference) stay plain torch's: proj replicated, the gradient the step applies whole.
    claims = subject.claims(_values("column_gathered", grad_allreduce=True))
    assert claims == subject.claims(_values("column_gathered")) and claims.module_types["proj"] == "Linear"
    cases = _cases(HEADS, "grad_allreduce", True)
    assert len(cases) == 2 and all(c.divergence and "grad" in c.divergence.checks and not c.divergence.raises
                                   and c.divergence.repro.endswith("deepspeed_grad_allreduce_replicated_grad.py")
                                   for c in cases)
    assert HELD_AXES["grad_allreduce"][0] is False


def test_embedding_partition_dim_zero_claims_vocabulary_rows_with_a_replicated_proj():
    subject = SUBJECTS["embed_spec_untied"]
    unset = subject.tensor_parallel_config(_values("embed_spec_untied"))["partition_config"]
    assert "embedding_partition_dim" not in unset
    for dim, proj, shard in ((1, "row", 1), (0, "skip", 0)):
        values = _values("embed_spec_untied", embedding_dim=dim)
        config = subject.tensor_parallel_config(values)["partition_config"]
        assert config["embedding_partition_dim"] == dim
        assert _spec_for(config, "embed_tokens.weight")["partition_type"] == "row"
        assert _spec_for(config, "proj.weight")["partition_type"] == proj
        claims = subject.claims(values)
        assert claims.param_shards["embed_tokens.weight"] == shard
        assert claims.module_types["proj"] == ("LinearAllreduce" if dim == 1 else "Linear")
    assert subject.claims(_values("embed_spec_untied", embedding_dim=1)) == subject.claims(_values("embed_spec_untied"))
    zero, one = _cases(HEADS, "embedding_dim", 0), _cases(HEADS, "embedding_dim", 1)
    assert len(zero) == len(one) == 2
    assert all(c.divergence and c.divergence.raises.startswith("RuntimeError: ") for c in zero)
    assert all(c.divergence is None for c in one)
    assert HELD_AXES["embedding_dim"][0] == "unset"


def test_strict_mode_variants_leave_exactly_the_named_module_unmatched():
    for variant, unmatched, matched in (("strict_unmatched_proj", "proj.weight", "lm_head.weight"),
                                        ("strict_unmatched_head", "lm_head.weight", "proj.weight")):
        config = ENGINE_VARIANTS[variant].tp_config["partition_config"]
        assert config["strict_mode"] is True and config["use_default_specs"] is False
        assert _spec_for(config, unmatched) is None and _spec_for(config, matched)["partition_type"] != "skip"
        cases = _cases(REJECTS, "variant", variant)
        assert {c["tp"] for c in cases} == {2, 3}
        assert all(c.expect.error == "ValueError" and c.expect.match == f"No matching spec for {unmatched}"
                   for c in cases)
    # The head unmatched after proj was converted: the half-converted model is the documented finding.
    head = _cases(REJECTS, "variant", "strict_unmatched_head")
    assert all("deepspeed_strict_mode_converts_model.py" in c.divergence.repro for c in head)
    proj = _cases(REJECTS, "variant", "strict_unmatched_proj")
    assert all("deepspeed_strict_mode_converts_model.py" not in c.divergence.repro for c in proj)
