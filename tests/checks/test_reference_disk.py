"""The reference cache's copy on disk (parity run --reference-cache DIR, parity/checks/reference_disk.py):
a stored pair is read back instead of computed; another model, seed or dtype, or an edit to the
references/ source, is another entry; a torn or foreign entry is computed again, never a failed run;
real cases get the same verdicts and results.jsonl with and without it; pytest-xdist workers share
one directory (pytest --parity-reference-cache DIR)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from parity.checks import compare
from parity.checks.reference_disk import ReferenceDisk
from parity.cli import main
from parity.matrix.cases import at_seeds, load, select
from parity.report.records import result_lines
from parity.settings import RunSettings
from parity.subjects import SUBJECTS

FP32 = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
BF16 = "column_gathered-bf16-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
NO_KEY = "ds_vocab_ce-fp32-none-v32-ign_none-tp2-cpu"  # its subject's reference has no reference_key
ROOT = Path(__file__).resolve().parents[2]
REFERENCES = ROOT / "references"


def case(case_id):
    return select(load(), None, [case_id], None)[0]


@pytest.fixture
def cache(tmp_path):
    return compare.ReferenceCache(disk_dir=tmp_path / "refs")


def entries(disk) -> list[Path]:
    return sorted(disk.directory.iterdir())


def assert_same_pair(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.records.keys() == y.records.keys() and x.layouts == y.layouts and x.floor_dtypes == y.floor_dtypes
        assert all(torch.equal(x.records[k], y.records[k]) and x.records[k].dtype == y.records[k].dtype
                   for k in x.records)


def computing_forbidden(monkeypatch, subject):
    # On the instance: the class's own reference() is what makes its reference_key.
    monkeypatch.setattr(subject, "reference", lambda *a, **k: pytest.fail("computed instead of read from disk"))


def test_a_stored_pair_is_read_back_instead_of_computed(cache, monkeypatch):
    c = case(FP32)
    subject = SUBJECTS[c.subject]
    computed = cache.pair(subject, c.values)
    assert cache.disk.stats == {"disk_hits": 0, "disk_writes": 1, "disk_unreadable": 0}
    assert [p.suffix for p in entries(cache.disk)] == [".pt"]  # no temporary file left behind
    cache.clear()  # as a later run, or another worker, starts
    computing_forbidden(monkeypatch, subject)
    assert_same_pair(cache.pair(subject, c.values), computed)
    assert cache.disk.stats["disk_hits"] == 1


def test_another_seed_or_dtype_is_another_entry(cache):
    for c in (case(FP32), at_seeds([case(FP32)], [1])[0], case(BF16)):
        cache.pair(SUBJECTS[c.subject], c.values)
    assert cache.disk.stats == {"disk_hits": 0, "disk_writes": 3, "disk_unreadable": 0} and len(entries(cache.disk)) == 3


def test_an_edit_to_the_references_source_is_another_key(tmp_path):
    copy = tmp_path / "references"
    shutil.copytree(REFERENCES, copy, ignore=shutil.ignore_patterns("__pycache__"))
    c = case(FP32)
    key = SUBJECTS[c.subject].reference_key(c.values)
    here = ReferenceDisk(tmp_path / "refs")._entry(key)[1]
    assert ReferenceDisk(tmp_path / "refs", references_dir=copy)._entry(key)[1] == here  # where it lies: no matter
    (copy / "sgd.py").write_text((copy / "sgd.py").read_text() + "\n# an edit\n")
    assert ReferenceDisk(tmp_path / "refs", references_dir=copy)._entry(key)[1] != here


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "another key"])
def test_a_torn_or_foreign_entry_is_computed_again_and_rewritten(cache, damage, capsys):
    c = case(FP32)
    subject = SUBJECTS[c.subject]
    computed = cache.pair(subject, c.values)
    (path,) = entries(cache.disk)
    data = path.read_bytes()
    if damage == "another key":  # a whole entry, but of another key (a hash collision, a copied file)
        torch.save({**torch.load(path, weights_only=True), "key": "another key"}, path)
    else:
        path.write_bytes({"truncated": data[:len(data) // 2], "garbage": b"not a torch file" * 50, "empty": b""}[damage])
    cache.clear()
    assert_same_pair(cache.pair(subject, c.values), computed)
    assert cache.disk.stats == {"disk_hits": 0, "disk_writes": 2, "disk_unreadable": 1}
    assert f"reference cache: {path} is unreadable" in capsys.readouterr().err
    cache.clear()
    assert_same_pair(cache.pair(subject, c.values), computed)  # the rewritten entry reads back
    assert cache.disk.stats["disk_hits"] == 1


def test_verdicts_and_results_are_the_same_with_and_without_it(tmp_path):
    from parity.harness.runner import Runner

    cases = [case(i) for i in (FP32, BF16, NO_KEY)]
    runner = Runner(timeout_s=120)
    runs = []
    try:
        for directory in (None, tmp_path / "refs", tmp_path / "refs"):  # none, filled, read back
            # Each run's own cache, as a later run starts with (the rank groups stay warm).
            runner.references = compare.ReferenceCache.from_settings(RunSettings(reference_disk=directory))
            verdicts = list(runner.run_all(cases))
            runs.append(([(v.case.id, v.status, v.reason) for v in verdicts],
                         [json.dumps(line, default=str) for v in verdicts for line in result_lines(v.as_dict())],
                         runner.references.disk and dict(runner.references.disk.stats)))
    finally:
        runner.close()
    (plain, plain_lines, _), (filled, filled_lines, wrote), (read, read_lines, hit) = runs
    assert "passed" in [s for _, s, _ in plain] and len(plain_lines) > 100  # numerical checks ran
    assert plain == filled == read and plain_lines == filled_lines == read_lines
    assert wrote == {"disk_hits": 0, "disk_writes": 2, "disk_unreadable": 0}  # NO_KEY's is never stored
    assert hit == {"disk_hits": 2, "disk_writes": 0, "disk_unreadable": 0}


def test_the_option_makes_the_directory_and_hands_it_to_the_cache(tmp_path):
    from argparse import Namespace

    from parity.cli import use_reference_cache

    directory = use_reference_cache(Namespace(reference_cache=str(tmp_path / "a" / "b"), no_reference_cache=False))
    references = compare.ReferenceCache.from_settings(RunSettings(reference_disk=directory))
    assert references.disk.directory == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()


def test_a_file_where_the_directory_should_be_is_a_one_line_error(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("")
    assert main(["run", "--reference-cache", str(taken), "--case", FP32]) == 2
    err = capsys.readouterr().err
    assert err == f"parity: --reference-cache {taken}: exists and is not a directory (allowed: a directory, created if missing)\n"
    assert main(["run", "--reference-cache", str(tmp_path / "new"), "--no-reference-cache", "--case", FP32]) == 2
    assert "--reference-cache and --no-reference-cache" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # refused before any cache was made


def test_pytest_workers_share_the_directory(tmp_path):
    """Two xdist workers, two cases of one reference_key (ZeRO 0 and 2): one entry, whole, and the
    same option pointed at a file is pytest's usage error."""
    refs, ids = tmp_path / "refs", [FP32, FP32.replace("zero0", "zero2")]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-n", "2",
                           # node ids, not -k: an id is a prefix of its quiet-axis variants (...-tp2-cpu-ovl)
                           "--parity-reference-cache", str(refs), *(f"cases/deepspeed_heads.toml::{i}" for i in ids)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.suffix for p in refs.iterdir()] == [".pt"]  # one key; whichever worker renamed last, no .tmp left
    taken = tmp_path / "taken"
    taken.write_text("")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--parity-reference-cache", str(taken), "--collect-only",
                           "-q", "tests/observe/test_partition.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert f"--parity-reference-cache {taken}: exists and is not a directory" in proc.stderr
