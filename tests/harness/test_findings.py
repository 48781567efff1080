"""A case under several known divergences reports each one: still present (a check it explains failed) or fixed
(its checks pass), and `parity diff` lists the findings a change fixed and those it made appear."""
from parity.checks.compare import Check
from parity.checks.verdict import DIVERGED, FIXED, PRESENT, XPASSED
from parity.harness.runner import _divergence_verdict
from parity.matrix.cases import Case, KnownDivergence, load, merged_divergence
from parity.report.diff import diff_runs, format_diff

NORM = KnownDivergence("the clipping norm counts rank 0's gradients only", "ci/repro/norm.py", ("grad_norm", "weight"),
                       name="unfused_clip_norm")
DTYPE = KnownDivergence("ZeRO 0 hands back the bf16 gradient", "ci/repro/dtype.py", ("contract",),
                        name="zero0_grad_dtype")
CASE = Case("x-case", "column_gathered", (("dtype", "bf16"),), divergence=merged_divergence([NORM, DTYPE]))


def checks(norm_fails: bool, dtype_fails: bool) -> list:
    return [Check("grad_norm", not norm_fails, step=0, measured=1.0, bound=0.1),
            Check("weight[lm_head.weight]", not norm_fails, step=0, measured=1.0, bound=0.1),
            Check("contract[grad]", not dtype_fails, rank=0, detail="dtype bfloat16, reference float32"),
            Check("loss", True, step=0, measured=0.0, bound=1.0)]


def test_one_finding_fixed_the_other_still_present():
    verdict = _divergence_verdict(CASE, checks(norm_fails=False, dtype_fails=True), strict=False)
    assert verdict.status == DIVERGED
    assert verdict.findings == {"unfused_clip_norm": FIXED, "zero0_grad_dtype": PRESENT}
    # The reason names the finding that still holds, not the fixed one, and says which one is fixed.
    assert "ZeRO 0 hands back the bf16 gradient" in verdict.reason
    assert "rank 0's gradients only" not in verdict.reason
    assert "fixed here (its checks pass): unfused_clip_norm" in verdict.reason


def test_every_finding_present_reads_as_before():
    verdict = _divergence_verdict(CASE, checks(norm_fails=True, dtype_fails=True), strict=False)
    assert verdict.findings == {"unfused_clip_norm": PRESENT, "zero0_grad_dtype": PRESENT}
    assert verdict.reason.startswith(f"known divergence: {CASE.divergence.reason} (repro: {CASE.divergence.repro});")


def test_all_fixed_is_xpassed_with_each_finding_fixed():
    verdict = _divergence_verdict(CASE, checks(norm_fails=False, dtype_fails=False), strict=False)
    assert verdict.status == XPASSED
    assert set(verdict.findings.values()) == {FIXED}


def summary(verdict) -> dict:
    return {"cases": [{"id": verdict.case.id, "verdict": verdict.status, "findings": verdict.findings}]}


def test_diff_lists_findings_fixed_and_newly_present():
    before = _divergence_verdict(CASE, checks(norm_fails=True, dtype_fails=True), strict=False)
    after = _divergence_verdict(CASE, checks(norm_fails=False, dtype_fails=True), strict=False)
    result = diff_runs(summary(before), summary(after))
    assert result["findings_fixed"] == [{"finding": "unfused_clip_norm", "cases": ["x-case"]}]
    assert result["findings_newly_present"] == [] and result["worse"] == 0
    assert "findings fixed" in format_diff(result, "A", "B")
    back = diff_runs(summary(after), summary(before))
    assert back["findings_newly_present"] == [{"finding": "unfused_clip_norm", "cases": ["x-case"]}]


def test_case_files_name_every_finding():
    """Every known divergence names its finding (findings/*.toml: a mark's finding key, an entry's reproducer)."""
    marked = [c for c in load() if c.divergence is not None]
    assert marked and all(f.name for c in marked for f in c.divergence.findings)
    # Cases under several marks in the default matrix list each one, flat (no finding nests another).
    merged = [c for c in marked if len(c.divergence.findings) > 1]
    assert merged and all(not f.parts for c in merged for f in c.divergence.findings)
