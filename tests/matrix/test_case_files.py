"""Case files: expansion, stable ids, and a clear error for every kind of bad input."""
import textwrap

import pytest

from parity.matrix.cases import CaseFileError, default_files, load, load_file

GOOD = """
[[matrix]]
subject = "vocab_parallel"
[matrix.axes]
dtype = ["fp32", "bf16"]
vocab = [34, 35]
zero = [0, 2]
[[matrix.exclude]]
dtype = "bf16"
vocab = 35
"""


def write(tmp_path, text, name="m.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_expansion_order_and_ids_are_stable(tmp_path):
    path = write(tmp_path, GOOD)
    first, second = load_file(path), load_file(path)
    assert [c.id for c in first] == [c.id for c in second]
    assert len(first) == 6  # 2*2*2 minus the 2 excluded
    assert first[0].id == "vocab_parallel-torch-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
    assert [c["dtype"] for c in first] == ["fp32"] * 4 + ["bf16"] * 2
    assert not any(c["dtype"] == "bf16" and c["vocab"] == 35 for c in first)


def test_only_keeps_matching_cases(tmp_path):
    path = write(tmp_path, GOOD + "[[matrix.only]]\nzero = 2\n")
    assert {c["zero"] for c in load_file(path)} == {2}


def test_markers_and_world_size(tmp_path):
    case = load_file(write(tmp_path, GOOD))[0]
    assert {"cpu", "world2", "case"} - {"case"} <= set(case.markers)
    assert case.world_size == 2


def test_sp_multiplies_the_world_and_names_the_case(tmp_path):
    text = '[[matrix]]\nsubject = "ds_vocab_ce"\n[matrix.axes]\ntp = [2]\nsp = [1, 3]\nseq_gather = [false]\n'
    one, three = load_file(write(tmp_path, text))
    assert (one.world_size, three.world_size) == (2, 6)
    assert "-sp" not in one.id and "-tp2-sp3-" in three.id and "world6" in three.markers


@pytest.mark.parametrize("text,key,fragment,allowed", [
    # combinations the axes' domains allow but the subject cannot run (Subject.invalid)
    ('[[matrix]]\nsubject = "ds_vocab_ce"\n[matrix.axes]\nseq_gather = [true]\n', "matrix[0].axes",
     "seq_gather needs sp > 1 and reduction 'none'", None),
    ('[[matrix]]\nsubject = "ds_vocab_ce"\n[matrix.axes]\nreduction = ["mean"]\nsp = [2]\nseq_gather = [true]\n',
     "matrix[0].axes", "seq_gather needs sp > 1 and reduction 'none'", None),
    ('[[matrix]]\nsubject = "ds_vocab_ce"\n[matrix.axes]\nsp = [5]\n', "matrix[0].axes",
     "sp 5 does not split the 24 tokens", None),
    ('[[matrix]]\nsubject = "ds_fused_linear_ce"\n[matrix.axes]\nsp = [3]\n', "matrix[0].axes",
     "sp 3 does not split the 40 tokens", None),
    ('[[matrix]]\nsubject = "megatron"\n', "matrix[0].subject", "unknown subject 'megatron'", "vocab_parallel"),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.axes]\nflavour = [1]\n', "matrix[0].axes.flavour",
     "unknown axis", "dtype"),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.axes]\ndtype = ["fp8"]\n', "matrix[0].axes.dtype",
     "bad value 'fp8'", "'fp32', 'bf16', 'fp16'"),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.axes]\nreduction = ["none"]\n', "matrix[0].axes.reduction",
     "not supported by this subject", "'mean', 'num_items'"),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.axes]\nvocab = [0]\n', "matrix[0].axes.vocab",
     "bad value 0", "an integer >= 1"),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.axes]\nbias = ["yes"]\n', "matrix[0].axes.bias",
     "bad value 'yes'", "True, False"),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.axes]\ndtype = []\n', "matrix[0].axes.dtype",
     "empty list", None),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[[matrix.exclude]]\ndtype = "fp32"\n', "matrix[0]",
     "expands to no cases", None),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[[matrix.exclude]]\nshape = 1\n', "matrix[0].exclude[0].shape",
     "unknown axis", "dtype"),
    ('[[matrix]]\nsubject = "vocab_parallel"\ncolour = 1\n', "matrix[0].colour", "unknown key", "subject"),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.expect]\nkind = "x"\n', "matrix[0].expect.kind",
     "unknown key", "error, match"),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[[matrix]]\nsubject = "vocab_parallel"\n', "id",
     "duplicate case id", None),
    ('[matrix\n', "(syntax)", "", None),
    ('title = "x"\n', "title", "unknown top-level key", "matrix"),
    ('', "matrix", "no [[matrix]] tables", None),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.known_divergence]\nreason = "x"\nrepro = "ci/repro/none.py"\n',
     "matrix[0].known_divergence.repro", "no such file", None),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.expect]\nerror = "ValueError"\n[matrix.known_divergence]\n'
     'reason = "x"\nrepro = "README.md"\nchecks = ["loss"]\n', "matrix[0].known_divergence.checks",
     "['loss'] not allowed with expect.error", None),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.known_divergence]\nrepro = "README.md"\n',
     "matrix[0].known_divergence.reason", "required", None),
    ('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.known_divergence]\nreason = "x"\nrepro = "README.md"\nwhy = 1\n',
     "matrix[0].known_divergence.why", "unknown key", "reason, repro, checks"),
])
def test_bad_input_names_file_key_and_allowed_values(tmp_path, text, key, fragment, allowed):
    path = write(tmp_path, text)
    with pytest.raises(CaseFileError) as info:
        load_file(path)
    err = info.value
    assert str(path) in str(err), str(err)
    assert err.key == key, str(err)
    assert fragment in str(err)
    if allowed:
        assert allowed in str(err), str(err)


def test_duplicate_ids_across_files_name_both(tmp_path):
    a = write(tmp_path, '[[matrix]]\nsubject = "vocab_parallel"\n', "a.toml")
    b = write(tmp_path, '[[matrix]]\nsubject = "vocab_parallel"\n', "b.toml")
    with pytest.raises(CaseFileError, match="also produced by .*a.toml"):
        load([a, b])


def test_missing_file_is_a_case_file_error(tmp_path):
    with pytest.raises(CaseFileError, match="nope.toml"):
        load_file(tmp_path / "nope.toml")


def test_default_matrix_is_large_and_unique():
    cases = load()
    assert default_files(), "no case files under cases/"
    assert len(cases) >= 150
    assert len({c.id for c in cases}) == len(cases)
