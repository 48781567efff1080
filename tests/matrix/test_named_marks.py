"""Named known-divergence marks (cases/marks/known_divergence.toml): an entry names one, the case files load
with its keys filled in, and a bad name or a clash is a one-line error naming the file and the key."""
import collections
import tomllib

import pytest

from parity.matrix import cases as cases_module
from parity.matrix.cases import CaseFileError, default_files, load_file, named_marks

MARKS = """
[mark.grad_dtype]
reason = '''the gradient comes back
in bf16'''
repro = "README.md"
binds = ["dtype", "zero"]
any_size = true
checks = ["contract[grad]"]

[mark.no_checks]
reason = "one mechanism, checks left to each table"
repro = "README.md"
"""

CASE = """
[[matrix]]
subject = "vocab_parallel"
[matrix.axes]
dtype = ["fp32", "bf16"]
zero = [0, 2]
[[matrix.known_divergence]]
where = { dtype = ["bf16"], zero = [0] }
mark = "grad_dtype"
"""


@pytest.fixture
def marks_file(tmp_path, monkeypatch):
    path = tmp_path / "marks" / "known_divergence.toml"
    path.parent.mkdir()
    path.write_text(MARKS)
    monkeypatch.setattr(cases_module, "MARKS_FILE", path)
    return path


def write(tmp_path, text, name="m.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_named_mark_resolves_to_its_keys_where_the_entry_says(tmp_path, marks_file):
    marked = {(c["dtype"], c["zero"]): c.divergence for c in load_file(write(tmp_path, CASE))}
    assert [k for k, d in marked.items() if d is not None] == [("bf16", 0)]
    divergence = marked[("bf16", 0)]
    assert divergence.reason == "the gradient comes back in bf16"  # whitespace folded, as an entry's own
    assert (divergence.repro, divergence.checks, divergence.any_size, divergence.binds) == (
        "README.md", ("contract[grad]",), True, ("dtype", "zero"))
    # The same keys written out in the entry load to the same mark: the name is only a shorthand.
    spelled = CASE.replace('mark = "grad_dtype"\n', MARKS.split("[mark.grad_dtype]\n")[1].split("\n[mark.")[0])
    assert [c.divergence for c in load_file(write(tmp_path, spelled, "spelled.toml"))] == list(marked.values())


def test_an_entry_adds_the_keys_its_mark_leaves_out(tmp_path, marks_file):
    text = CASE.replace('mark = "grad_dtype"', 'mark = "no_checks"\nchecks = ["loss"]\nany_size = true')
    divergence = next(c.divergence for c in load_file(write(tmp_path, text)) if c.divergence)
    assert (divergence.reason, divergence.checks, divergence.any_size) == (
        "one mechanism, checks left to each table", ("loss",), True)


@pytest.mark.parametrize("entry,key,fragment,allowed", [
    ('mark = "grad_dtpye"', "matrix[0].known_divergence[0].mark", "unknown mark 'grad_dtpye'",
     "grad_dtype, no_checks"),
    ('mark = 3', "matrix[0].known_divergence[0].mark", "unknown mark 3", "grad_dtype"),
    # Restating a key the mark sets could quietly say something else than every other case under that name.
    ('mark = "grad_dtype"\nchecks = ["loss"]', "matrix[0].known_divergence[0].checks",
     "already set by mark 'grad_dtype'", "where"),
    ('mark = "grad_dtype"\nwhy = 1', "matrix[0].known_divergence[0].why", "unknown key", "mark"),
])
def test_a_bad_reference_is_a_one_line_error_naming_file_and_key(tmp_path, marks_file, entry, key, fragment,
                                                                 allowed):
    path = write(tmp_path, CASE.replace('mark = "grad_dtype"', entry))
    with pytest.raises(CaseFileError) as info:
        load_file(path)
    err = info.value
    assert err.key == key and fragment in str(err) and allowed in str(err), str(err)
    assert str(err).startswith(f"{path}: {key}: ") and "\n" not in str(err)


def test_a_marks_binds_must_be_axes_of_the_subject_that_names_it(tmp_path, marks_file):
    marks_file.write_text(MARKS.replace('binds = ["dtype", "zero"]', 'binds = ["dtype", "kl_grad"]'))
    with pytest.raises(CaseFileError) as info:
        load_file(write(tmp_path, CASE))
    assert info.value.key == "matrix[0].known_divergence[0].mark", str(info.value)
    assert "mark 'grad_dtype': binds not an axis of the subject: 'kl_grad'" in str(info.value)


@pytest.mark.parametrize("marks,key,fragment", [
    (MARKS.replace("any_size = true", 'where = { zero = [0] }'), "mark.grad_dtype.where", "unknown key"),
    (MARKS.replace('repro = "README.md"', 'repro = "ci/repro/none.py"', 1), "mark.grad_dtype.repro", "no such file"),
    (MARKS.replace("any_size = true", 'any_size = "yes"'), "mark.grad_dtype.any_size", "bad value"),
    ("[marks.grad_dtype]\nreason = 'r'\nrepro = 'README.md'\n", "marks", "unknown top-level key"),
    ("mark = 1\n", "mark", "no [mark.NAME] tables"),
    ("[mark\n", "(syntax)", ""),
])
def test_a_bad_marks_file_is_an_error_naming_it_and_the_key(tmp_path, marks_file, marks, key, fragment):
    marks_file.write_text(marks)
    with pytest.raises(CaseFileError) as info:
        load_file(write(tmp_path, CASE))
    assert info.value.key == key and fragment in str(info.value), str(info.value)
    assert str(marks_file) in str(info.value)


def test_a_case_file_without_named_marks_needs_no_marks_file(tmp_path, monkeypatch):
    monkeypatch.setattr(cases_module, "MARKS_FILE", tmp_path / "absent.toml")
    assert load_file(write(tmp_path, CASE.replace('mark = "grad_dtype"', 'reason = "r"\nrepro = "README.md"')))
    with pytest.raises(CaseFileError, match=r"absent.toml: \(file\)"):
        load_file(write(tmp_path, CASE, "named.toml"))


def _entries():
    """Every known_divergence entry of the default case files: (file:matrix[i], entry)."""
    for path in default_files():
        for i, table in enumerate(tomllib.loads(path.read_text())["matrix"]):
            raw = table.get("known_divergence")
            for entry in raw if isinstance(raw, list) else [raw] if raw else []:
                yield f"{path.name}:matrix[{i}]", entry


def test_every_named_mark_is_named_and_no_reason_is_copied():
    entries = list(_entries())
    named = {e["mark"] for _, e in entries if "mark" in e}
    assert sorted(set(named_marks()) - named) == [], "named marks no case file names (remove them)"
    # One mechanism, one text: a reason written out in two entries belongs in cases/marks/known_divergence.toml.
    by_reason = collections.defaultdict(list)
    for name, mark in named_marks().items():
        by_reason[" ".join(mark["reason"].split())].append(f"mark.{name}")
    for where, entry in entries:
        if "reason" in entry:
            by_reason[" ".join(entry["reason"].split())].append(where)
    copied = {reason[:80]: places for reason, places in by_reason.items() if len(places) > 1}
    assert copied == {}, "reasons written out in several entries: name a mark instead (mark = \"NAME\")"
