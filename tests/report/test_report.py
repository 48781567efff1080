"""The report directory of `parity run --report` (results.jsonl, summary.md, report.html) for a
small real run with a failing and a passing case, one run shared by every test here; report.html
rendered in headless Chromium; and the writer fed plain verdict dicts."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from parity.report.console import write_report
from tests.conftest import skip_or_fail
from tests.report_runs import FAILING, FAULTY, PASSING, ROOT, shared_report


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    return shared_report(tmp_path_factory, "failing_and_passing")


def test_report_files_hold_each_check_and_the_failure(report_dir):
    summary = json.loads((report_dir / "summary.json").read_text())
    assert summary["counts"]["failed"] == 1 and summary["counts"]["passed"] == 1
    assert all("check_results" not in c for c in summary["cases"])  # per-check detail: results.jsonl
    failing = next(c for c in summary["cases"] if c["id"] == FAILING)
    assert failing["first_divergence"]["name"] == "head_input_grad" and failing["worst_check"]["name"]

    lines = [json.loads(line) for line in (report_dir / "results.jsonl").read_text().splitlines()]
    assert {line["case"] for line in lines} == {FAILING, PASSING}
    numeric = [line for line in lines if line["measured"] is not None]
    assert numeric and all({"bound", "margin", "ratio", "step", "rank", "subject", "verdict"} <= set(line)
                           for line in numeric)
    over = [line for line in numeric if line["case"] == FAILING and not line["passed"]]
    assert over and all(line["margin"] < 0 and line["ratio"] > 1 for line in over)
    assert all(line["passed"] for line in lines if line["case"] == PASSING)

    md = (report_dir / "summary.md").read_text()
    assert "## Failed (1)" in md and f"--case {FAILING}" in md and "head_input_grad" in md
    assert "| total | 2 | 1 | 1 |" in md

    html = (report_dir / "report.html").read_text()
    section = html[html.index(f"<h3>{FAILING}"):]
    section = section[:section.index("</section>")]
    assert "First divergence" in section and "head_input_grad" in section
    assert f"parity run --matrix {FAULTY.relative_to(ROOT)} --case {FAILING}" in section
    assert re.search(r'<img alt="error vs bound per step[^"]*" src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"',
                     section)
    assert "histogram of measured/bound ratios" in html and "http://" not in html and "https://" not in html


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    skip_or_fail("no headless Chromium on PATH (chromium, chromium-browser or google-chrome): "
                 "apt-get install -y --no-install-recommends chromium (.ci/run does where it can)")


def _rendered_body(chromium: str, page: Path) -> str:
    # --virtual-time-budget lets the page's load handler run before the DOM is dumped.
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_report_renders_in_headless_chromium(report_dir, tmp_path):
    chromium = _chromium()
    dom = _rendered_body(chromium, report_dir / "report.html")
    images = re.search(r'<body data-images="([^"]*)"', dom)
    assert images and images.group(1).startswith("ok ") and int(images.group(1).split()[1]) >= 2, dom[:500]
    assert FAILING in dom and "First divergence" in dom and f"--case {FAILING}" in dom
    # The probe can fail: one corrupted image is reported as broken.
    html = (report_dir / "report.html").read_text()
    broken = tmp_path / "broken.html"
    broken.write_text(html.replace("data:image/png;base64,", "data:image/png;base64,AAAA", 1))
    assert 'data-images="broken 1 of' in _rendered_body(chromium, broken)


def record(case_id, verdict, ratios, failed_at=None):
    """A verdict dict as Verdict.as_dict() makes it, by hand: the writer needs no live objects."""
    checks = [{"name": "logits", "step": step, "micro": 0, "rank": rank, "passed": step != failed_at,
               "measured": r * 1e-6, "bound": 1e-6, "margin": 1e-6 - r * 1e-6, "ratio": r, "detail": ""}
              for step, r in enumerate(ratios) for rank in (0, 1)]
    return {"id": case_id, "subject": "synthetic", "axes": {}, "verdict": verdict, "seconds": 0.1, "mode": None,
            "checks": len(checks), "failed_checks": sum(not c["passed"] for c in checks),
            "worst_ratio": max(ratios) if ratios else None, "first_failure": None, "reason": None,
            "repro": f"parity run --case {case_id}", "rank_errors": {}, "check_results": checks}


def test_write_report_from_plain_dicts_marks_near_failing_cases(tmp_path):
    from parity.checks.tolerances import NEAR_FAILING_RATIO

    records = [record("near", "passed", [0.1, NEAR_FAILING_RATIO]), record("far", "passed", [0.1, 0.2]),
               record("over", "failed", [0.3, 2.0], failed_at=1),
               {**record("skip", "skipped", []), "reason": "needs a GPU"}]
    write_report(tmp_path, records, 1.0, ["parity", "run"])
    html = (tmp_path / "report.html").read_text()
    toc = html[html.index("<nav>"):html.index("</nav>")]
    assert "near-failing" in toc and ">near<" in toc and ">over<" in toc and ">far<" not in toc
    assert "needs a GPU" in html and "needs a GPU" in (tmp_path / "summary.md").read_text()
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [line["reason"] for line in lines if line["case"] == "skip"] == ["needs a GPU"]
    # One row per tensor and step: the two ranks' checks fold into the worst, which carries its rank.
    over = [line for line in lines if line["case"] == "over"]
    assert [(line["step"], line["checks"], line["passed"], line["ratio"]) for line in over] == [
        (0, 2, True, 0.3), (1, 2, False, 2.0)]
    assert over[1]["rank"] == 0 and over[1]["margin"] < 0


def test_ratios_are_drawn_by_check_kind_and_dtype(tmp_path):
    from parity.report.plots import ratios_by_kind

    fp32 = {**record("a", "passed", [0.1, 0.2]), "axes": {"dtype": "fp32", "seed": 0}}
    bf16 = {**record("b", "passed", [0.5]), "axes": {"dtype": "bf16", "seed": 1}}
    bf16["check_results"].append({**bf16["check_results"][0], "name": "grad[lm_head.weight]", "ratio": 0.9})
    bf16["check_results"].append({**bf16["check_results"][0], "name": "contract[loss]", "bound": None,
                                  "ratio": None})  # no tolerance: not a ratio
    assert ratios_by_kind([fp32, bf16]) == {("fp32", "logits"): [0.1, 0.1, 0.2, 0.2], ("bf16", "logits"): [0.5, 0.5],
                                            ("bf16", "grad"): [0.9]}
    write_report(tmp_path, [fp32, bf16], 1.0, ["parity", "run", "--seeds", "2"])
    assert re.search(r'<img alt="measured/bound by check kind and dtype" src="data:image/png;base64,[A-Za-z0-9+/=]{500,}"',
                     (tmp_path / "report.html").read_text())


def test_without_matplotlib_the_report_is_written_and_says_the_plots_are_missing(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    write_report(tmp_path, [record("over", "failed", [0.3, 2.0], failed_at=1)], 1.0, ["parity", "run"])
    html = (tmp_path / "report.html").read_text()
    assert "matplotlib is not installed (pip install &#x27;tp-parity[report]&#x27;)" in html, html[:2000]
    assert "data:image/png" not in html
