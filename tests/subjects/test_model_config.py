"""The model_config axis (issue 13, AutoTP's kv-head split): what config the user's model carries, what the vocab
parallel subjects hand DeepSpeed and expect it to read back, without a rank."""
import pytest

from parity.axes import AXES
from parity.matrix.cases import CASES_DIR, load_file
from parity.subjects import SUBJECTS
from parity.subjects.base import NAMED_HEADS
from parity.subjects.values import resolve
from references.model_config import MODEL_CONFIGS, hf_like_config, text_kv_heads

REPRO = "ci/repro/deepspeed_kv_head_rule_on_lm_head.py"
CASES = [c for f in ("deepspeed_heads.toml", "deepspeed_tied_heads.toml") for c in load_file(CASES_DIR / f)
         if c.values.optional("model_config", "none") != "none" or c.values.optional("head", None) == "output"]


def _values(subject, **axes):
    return resolve(SUBJECTS[subject], axes)


def test_the_axis_offers_every_named_config_and_is_quiet_at_none():
    axis = AXES["model_config"]
    assert set(axis.values) == set(MODEL_CONFIGS) and axis.default == "none" and axis.quiet_default


def test_kv_heads_follow_transformers_rule():
    # num_key_value_heads where set, else num_attention_heads; a multimodal config's text tower, not its outer heads
    assert {n: text_kv_heads(n) for n in MODEL_CONFIGS} == {"none": None, "heads4": 4, "kv3": 3, "kv1": 1,
                                                            "text_kv3": 3}


def test_config_carries_sizes_tie_and_text_tower():
    config = hf_like_config("text_kv3", 36, 32, True)
    assert (config.vocab_size, config.hidden_size, config.tie_word_embeddings) == (36, 32, True)
    assert config.num_attention_heads == 16 and config.num_key_value_heads is None
    assert config.text_config.num_key_value_heads == 3 and config.text_config.vocab_size == 36
    assert hf_like_config("none", 36, 32, False) is None


def test_unknown_config_is_one_clear_line():
    with pytest.raises(ValueError, match="model_config must be one of .*got 'kv9'"):
        hf_like_config("kv9", 36, 32, False)


@pytest.mark.parametrize("subject", ["vocab_parallel", "tied_vocab_parallel"])
def test_built_model_carries_the_config_only_when_asked(subject):
    import torch

    plain = SUBJECTS[subject].build(_values(subject, vocab=36), torch.float32)
    with_config = SUBJECTS[subject].build(_values(subject, vocab=36, model_config="kv3"), torch.float32)
    assert not hasattr(plain, "config")
    assert with_config.config == hf_like_config("kv3", 36, 32, subject == "tied_vocab_parallel")
    # a config changes no weight: the reference (which never reads it) is shared
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), with_config.parameters()))
    key = SUBJECTS[subject].reference_key
    assert key(_values(subject, vocab=36)) == key(_values(subject, vocab=36, model_config="kv3"))


def test_deepspeed_must_read_the_kv_head_count_back():
    subject = SUBJECTS["vocab_parallel"]
    assert subject.decided(_values("vocab_parallel", model_config="text_kv3"))["kv_heads"] == 3
    assert "kv_heads" not in subject.decided(_values("vocab_parallel"))


def test_output_head_is_passed_as_lm_head_patterns_only_where_it_can_be():
    subject = SUBJECTS["vocab_parallel"]
    config = subject.tensor_parallel_config(_values("vocab_parallel", head="output"))["partition_config"]
    assert config["lm_head_patterns"] == ["output"]
    for head in ("lm_head", "embed_out", "model.lm_head"):
        assert "lm_head_patterns" not in subject.tensor_parallel_config(_values("vocab_parallel", head=head))[
            "partition_config"]
    # Named, not the whole axis: heuristic_blocks' block head (layers.1.lm_head) is no head of this model.
    assert SUBJECTS["vocab_parallel"].axes["head"] == (*NAMED_HEADS, "output")
    assert [n for n, s in SUBJECTS.items() if "head" in s.axes and s.axes["head"] is None] == []
    # A subject that offers the head "output" as its vocabulary-parallel head passes it as lm_head_patterns too (the
    # universal-checkpoint vocab-parallel subject builds vocab_parallel's head config); tied_column_gathered and
    # tied_plan_head name it by a spec or a plan and claim it replicated.
    offered = [n for n, s in SUBJECTS.items() if "head" in s.axes and s.axes["head"] and "output" in s.axes["head"]
               and SUBJECTS[n].claims(_values(n, head="output")).module_types["output"] == "VocabParallelLinear"]
    assert {"vocab_parallel", "uc_vocab_parallel"} <= set(offered)
    for name in offered:
        assert SUBJECTS[name].tensor_parallel_config(_values(name, head="output"))["partition_config"][
            "lm_head_patterns"] == ["output"], name
    assert "output" not in NAMED_HEADS


def test_case_files_mark_exactly_the_heads_the_name_test_misses():
    assert CASES
    for case in CASES:
        v = case.values
        k = text_kv_heads(v.optional("model_config", "none"))
        misses_name = v["head"] != "lm_head"
        split_by_heads = k is not None and misses_name and v["vocab"] % k == 0 and k % v["tp"] != 0
        assert (case.divergence is not None) == split_by_heads, case.id
        if split_by_heads:
            assert case.divergence.repro == REPRO
            assert bool(case.divergence.raises) == (k < v["tp"]), case.id  # an empty shard: refused at initialize
