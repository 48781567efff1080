"""The mutation check's fast subset (3 planted bugs x 2 cases): every one must be killed, i.e.
fail a parity check, not merely crash. Runs as a subprocess: PARITY_MUTANT and the reference
patches must not leak into this test process or its shared rank groups."""
import json
import subprocess
import sys
from pathlib import Path

from parity.mutation import catalog as mutants
from parity.matrix.cases import Case
from parity.checks.compare import Check
from parity.mutants import CRASHED, FAST_MUTANTS, KILLED, SURVIVED, _case_outcome
from parity.harness.rank_pool import RankError
from parity.checks.verdict import FAILED, PASSED, Verdict

ROOT = Path(__file__).resolve().parents[2]


def test_fast_subset_kills_every_mutant(tmp_path):
    out = tmp_path / "mutants.json"
    proc = subprocess.run([sys.executable, "ci/mutation_check.py", "--fast", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["baseline_green"]
    assert {r["mutant"] for r in report["mutants"]} == set(FAST_MUTANTS)
    for row in report["mutants"]:
        for family, cell in row["cells"].items():
            assert cell["status"] == KILLED, (row["mutant"], family, cell)
            assert any(c["failed_checks"] > 0 for c in cell["cases"])


def _case():
    return Case(id="x", subject="column_gathered", axes=(("dtype", "fp32"),))


def test_a_crash_is_not_a_kill():
    crashed = Verdict(_case(), FAILED, reason="rank 1 raised RuntimeError",
                      rank_errors={1: RankError(1, "RuntimeError", "boom", "tb")})
    killed = Verdict(_case(), FAILED, checks=[Check("loss", False, measured=1.0, bound=0.1)])
    survived = Verdict(_case(), PASSED, checks=[Check("loss", True, measured=0.0, bound=0.1)])
    assert _case_outcome(crashed)["outcome"] == CRASHED
    assert _case_outcome(killed)["outcome"] == KILLED
    assert _case_outcome(survived)["outcome"] == SURVIVED


def test_a_documented_divergence_is_a_survival_and_a_green_baseline():
    from parity.checks.verdict import DIVERGED, XPASSED
    from parity.mutants import AS_DOCUMENTED

    for status in (DIVERGED, XPASSED):
        assert _case_outcome(Verdict(_case(), status, checks=[Check("contract[grad]", False)]))["outcome"] == SURVIVED
    assert DIVERGED in AS_DOCUMENTED and FAILED not in AS_DOCUMENTED


def test_catalog_is_complete():
    assert len(mutants.MUTANTS) >= 8
    assert len({m.name for m in mutants.MUTANTS}) == len(mutants.MUTANTS)
    assert any(m.where == "parent" for m in mutants.MUTANTS)
    for m in mutants.MUTANTS:
        assert m.description and m.replaces and m.observable and m.families
        assert set(m.families) <= set(mutants.families()) and m.where in ("rank", "parent")
        # A mutant's own killing cases are cases of its families' selections (the check runs only those).
        from parity.mutants import SELECTION

        assert set(m.cases) <= {i for f in m.families for i in SELECTION[f]}, m.name


def test_a_family_that_cannot_run_here_is_left_out_and_named(monkeypatch, capsys):
    # megatron_column_gathered is CUDA only: without CUDA its family is not judged, and says so.
    from parity.mutants import select_cases
    from parity.observe.capabilities import ASSUME_MISSING_VAR

    monkeypatch.setenv(ASSUME_MISSING_VAR, "cuda")
    cases = select_cases([mutants.M_COLUMN, mutants.M_VOCAB], None)
    assert list(cases) == [mutants.M_VOCAB]
    assert f"family {mutants.M_COLUMN!r} is not judged here" in capsys.readouterr().out
def test_red_baseline_has_its_own_exit_status(monkeypatch, tmp_path, capsys):
    # A broken suite or machine must not read as "a mutant survived" (1) or "bad input" (2).
    import parity.mutants as check

    red = [{"verdict": FAILED, "case": "column_gathered-x", "seconds": 0.1, "first_failure": "loss: 1 > 0.1"}]
    monkeypatch.setattr(check, "run_cases", lambda *a, **k: red)
    monkeypatch.setattr(check, "select_cases", lambda families, per: {f: [] for f in families})

    class NoRunner:
        def __init__(self, *settings, **kw):
            pass

        def close(self):
            pass

    monkeypatch.setattr("parity.harness.runner.Runner", NoRunner)
    out = tmp_path / "m.json"
    status = check.main(["--mutant", next(iter(FAST_MUTANTS)), "--json", str(out), "--logs", str(tmp_path)])
    assert status == check.BASELINE_RED == 3
    assert json.loads(out.read_text())["baseline_green"] is False
    assert "baseline is not green" in capsys.readouterr().err
