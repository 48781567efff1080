"""README.md stays a newcomer's page: at most 300 lines, opening with the two commands, and every command its sh blocks
show is run by some test (here, where it is cheap; else the test or CI script named beside it)."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIRST_COMMANDS = ["bash ci/setup.sh && .venv/bin/parity run", ".venv/bin/python -m pytest -n 2"]

# Commands too slow to run here, and the file whose run runs them (the file must hold the needle).
ELSEWHERE = {
    "bash ci/setup.sh && .venv/bin/parity run": [(".ci/run", "bash ci/setup.sh"),
                                                  ("tests/report/test_deepspeed_change.py", '_parity("run"')],
    ".venv/bin/python -m pytest -n 2": [(".ci/run", ".venv/bin/python -m pytest -n 2")],
    # Steps 1-4 of "Testing a DeepSpeed change": the test puts a patched copy first on PYTHONPATH in place of
    # `pip install -e` (the README says both work), then runs the same run/run/diff.
    '.venv/bin/parity run --report /tmp/base -k "ds_vocab_ce or vocab_parallel"':
        [("tests/report/test_deepspeed_change.py", '_parity("run", "--report"')],
    ".venv/bin/pip install -e ~/src/DeepSpeed": [("tests/report/test_deepspeed_change.py", '"PYTHONPATH"')],
    '.venv/bin/parity run --report /tmp/mine -k "ds_vocab_ce or vocab_parallel"':
        [("tests/report/test_deepspeed_change.py", '_parity("run", "--report"')],
    ".venv/bin/parity diff /tmp/base /tmp/mine": [("tests/report/test_deepspeed_change.py", '_parity("diff"')],
    # Its qwen2 row runs this very config (and the llama and cohere ones) end to end.
    ".venv/bin/parity check --arch qwen2 --ds-config tests/cli/check_configs/qwen2_bf16_zero2_vocab.json":
        [("tests/cli/test_check.py", 'main(["check", "--arch", arch, "--ds-config"'),
         ("tests/cli/test_check.py", '("qwen2", "qwen2_bf16_zero2_vocab.json"')],
    "python ci/try_fix.py fixes/deepspeed/unfused_grad_norm_tp.patch":
        [("tests/fixes/test_deepspeed_fixes.py", '"ci/try_fix.py"')],
}
# Cheap enough to run as shown (`.venv/bin/parity` as this interpreter's `-m parity.cli`).
RUN_HERE = [
    ".venv/bin/parity findings",
    ".venv/bin/parity findings --issue deepspeed_unfused_grad_norm_tp",
    ".venv/bin/parity list --matrix cases/zoo.toml",
    ".venv/bin/parity list --matrix cases/zoo/full.toml --matrix cases/zoo/full_transformers_tp.toml",
]


def sh_commands(text: str) -> list:
    """The command lines of the page's ```sh blocks, trailing comments dropped."""
    commands, fenced = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = line[3:].strip() if fenced is None else None
        elif fenced == "sh" and line.strip() and not line.lstrip().startswith("#"):
            commands.append(re.sub(r"\s+#\s.*$", "", line).strip())
    return commands


def test_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, f"README.md has {len(text.splitlines())} lines: move sections to docs/"
    assert sh_commands(text)[:2] == FIRST_COMMANDS


def test_every_readme_command_is_run_by_a_test():
    commands = sh_commands(README.read_text())
    unrun = [c for c in commands if c not in ELSEWHERE and c not in RUN_HERE]
    assert not unrun, f"README commands no test runs: {unrun}"
    assert not [c for c in [*ELSEWHERE, *RUN_HERE] if c not in commands], "a listed command left the README"
    for command, runners in ELSEWHERE.items():
        for path, needle in runners:
            assert needle in (ROOT / path).read_text(), f"{path} no longer runs {command!r}"


@pytest.mark.parametrize("command", RUN_HERE)
def test_cheap_readme_command_runs(command):
    args = shlex.split(command)
    assert args[0] == ".venv/bin/parity"
    done = subprocess.run([sys.executable, "-m", "parity.cli", *args[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip()


def test_the_fix_the_readme_tries_exists_and_try_fix_starts():
    assert (ROOT / "fixes" / "deepspeed" / "unfused_grad_norm_tp.patch").is_file()
    done = subprocess.run([sys.executable, "ci/try_fix.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "--rejected" in done.stdout, done.stderr[-2000:]
