"""Every pytest marker a case carries is registered in pyproject.toml (an unregistered one is a
PytestUnknownMarkWarning per world size, and `-m world6` would select by a typo-prone name)."""
import tomllib
from pathlib import Path

from parity.matrix.cases import load

ROOT = Path(__file__).resolve().parents[2]


def test_case_markers_are_registered():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    registered = {m.split(":")[0].strip() for m in config["tool"]["pytest"]["ini_options"]["markers"]}
    used = {marker for case in load() for marker in ("case",) + case.markers}
    assert used <= registered, f"register in pyproject.toml [tool.pytest.ini_options] markers: {sorted(used - registered)}"
