"""The str-hash seed is pinned for every process that computes references (parity/hash_seed.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from parity import cli, hash_seed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _unpinned_env():
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PYTHONHASHSEED", None)
    return env


def test_this_process_is_pinned():
    # pytest's own process (conftest.py started it again) and its xdist workers (they inherit it)
    assert os.environ.get("PYTHONHASHSEED") == hash_seed.HASH_SEED


def test_a_command_line_starts_again_pinned(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        from parity.hash_seed import restart_pinned
        restart_pinned()
        print(os.environ["PYTHONHASHSEED"], sys.argv[1:], hash("sliding_attention"))
        """))
    runs = [subprocess.run([sys.executable, str(script), "a", "b c"], env=_unpinned_env(), capture_output=True,
                           text=True, check=True).stdout for _ in range(2)]
    assert runs[0] == runs[1] and runs[0].startswith("0 ['a', 'b c'] ")


def test_an_explicit_seed_is_kept(tmp_path):
    out = subprocess.run([sys.executable, "-c", "from parity.hash_seed import restart_pinned; import os; "
                          "restart_pinned(); print(os.environ['PYTHONHASHSEED'])"],
                         env=dict(_unpinned_env(), PYTHONHASHSEED="7"), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "7"


def test_the_cli_pins_its_command_line_only(monkeypatch):
    called = []
    monkeypatch.setattr(hash_seed, "restart_pinned", lambda: called.append(True))
    cli.main(["list", "-k", "no_case_has_this_name"])
    assert called == []
    monkeypatch.setattr(sys, "argv", ["parity", "list", "-k", "no_case_has_this_name"])
    cli.main()
    assert called == [True]
