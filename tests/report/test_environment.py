"""What a report says it tested: a package outside its installed distribution is recorded with
where it came from and, in a git tree, its commit and dirty flag; `parity diff` names each change."""
import subprocess
import sys

from parity.report.environment import SCHEMA_VERSION, package, version_changes


def _git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_a_checkout_on_the_path_records_its_commit_and_dirty_flag(tmp_path, monkeypatch):
    (tmp_path / "fakeds").mkdir()
    (tmp_path / "fakeds" / "__init__.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "base")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    clean = package("fakeds-not-installed", "fakeds")
    assert clean["path"] == str((tmp_path / "fakeds").resolve()) and clean["version"] is None
    assert clean["from_installed_distribution"] is False and clean["git"] == {"commit": head, "dirty": False}
    (tmp_path / "fakeds" / "__init__.py").write_text("x = 2\n")
    assert package("fakeds-not-installed", "fakeds")["git"] == {"commit": head, "dirty": True}


def test_an_installed_release_has_a_version_and_no_git_lookup():
    torch = package("torch", "torch")
    assert torch["version"] and torch["from_installed_distribution"] and "git" not in torch
    assert package("no-such-dist", "no_such_module_xyz") == {"version": None, "path": None}


def test_version_changes_name_package_old_and_new():
    a = {"schema_version": SCHEMA_VERSION, "packages": {
        "deepspeed": {"version": "0.19.8", "path": "/site/deepspeed"},
        "torch": {"version": "2.13.0", "path": "/site/torch"}}}
    b = {"packages": {
        "deepspeed": {"version": "0.19.9", "path": "/src/DeepSpeed/deepspeed", "git": {"commit": "a" * 40, "dirty": True}},
        "torch": {"version": "2.13.0", "path": "/site/torch"}}}
    assert version_changes(a, b) == ["deepspeed: 0.19.8 -> 0.19.9",
                                     "deepspeed: imported from /site/deepspeed -> /src/DeepSpeed/deepspeed",
                                     "deepspeed: git none -> aaaaaaaaaaaa (dirty)"]
    assert version_changes(a, a) == [] and version_changes({}, {}) == []
    assert version_changes({}, b) == [f"package versions not recorded in A (a report older than schema {SCHEMA_VERSION})"]
