"""What an install needs: a Python the code runs on, the case files found (or a one-line error saying
where to point), and test/report dependencies kept out of the core install."""
import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return found | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_requires_python_covers_tomllib():
    users = [p for d in ("parity", "references") for p in (ROOT / d).rglob("*.py") if "tomllib" in _imports(p)]
    assert users, "nothing imports tomllib any more: requires-python may go lower"
    assert PYPROJECT["project"]["requires-python"] == ">=3.11", [str(p) for p in users]


def test_test_and_report_dependencies_are_extras_and_nothing_is_pinned_exactly():
    core = [d.split(";")[0].replace(" ", "") for d in PYPROJECT["project"]["dependencies"]]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not any(d.startswith(("matplotlib", "pytest-xdist", "check-jsonschema")) for d in core), core
    assert any(d.startswith("matplotlib") for d in extras["report"])
    assert {"pytest-xdist", "check-jsonschema"} <= {d.split(">")[0].split("=")[0] for d in extras["test"]}
    everything = core + [d for ds in extras.values() for d in ds]
    assert not [d for d in everything if "==" in d], "exact pins belong in requirements-cpu.txt"


def _list(env_dir):
    env = {**os.environ, "PARITY_CASES_DIR": str(env_dir)}
    return subprocess.run([sys.executable, "-m", "parity.cli", "list"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cases_dir_without_case_files_is_a_one_line_error(tmp_path):
    proc = _list(tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "PARITY_CASES_DIR" in proc.stderr and "no case files" in proc.stderr and str(tmp_path) in proc.stderr


def test_cases_dir_elsewhere_finds_its_cases_and_repro_scripts(tmp_path):
    shutil.copytree(ROOT / "cases", tmp_path / "cases")
    shutil.copytree(ROOT / "ci" / "repro", tmp_path / "ci" / "repro")
    shutil.copytree(ROOT / "findings", tmp_path / "findings")  # the findings the marks name, beside the cases too
    here, there = _list(ROOT / "cases"), _list(tmp_path / "cases")
    assert there.returncode == 0 and there.stdout == here.stdout, there.stderr
    shutil.rmtree(tmp_path / "ci")  # known divergences name repro scripts relative to the cases' parent
    broken = _list(tmp_path / "cases")
    assert broken.returncode == 2 and ".repro: no such file" in broken.stderr, broken.stderr
