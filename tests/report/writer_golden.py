"""A fixed set of verdict dicts and the report files the writer made of them, kept to show that a
change meant to make writing faster changes no byte of what is written (test_writer_golden.py).

The records: the six real cases of results/report-example (data/writer-records.json.gz) and a few
made by hand for what those six lack (a skip, a harness error, an xpass, non-finite and non-ASCII
values, more near-failing cases than are drawn). The environment is fixed, so only the writer varies.

    python -m tests.report.writer_golden    # rewrite data/writer-golden/ with this tree's writer

Rewrite it only when the report is meant to change, and say so in the commit.
"""
from __future__ import annotations

import gzip
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

DATA = Path(__file__).resolve().parent / "data"
RECORDS = DATA / "writer-records.json.gz"
GOLDEN = DATA / "writer-golden"
FILES = ("summary.json", "results.jsonl", "summary.md", "report.html")
# The images depend on these; the golden's versions are kept beside it (versions.json).
PLOTTING = ("matplotlib", "pillow", "numpy")
MAX_PLOTTED = 7  # instead of 50: four failures and three near-failing cases drawn, three listed only; quick

PACKAGES = {"torch": {"version": "2.8.0", "path": "/site/torch", "from_installed_distribution": True, "git": None},
            "deepspeed": {"version": "0.19.8", "path": "/src/DeepSpeed", "from_installed_distribution": False,
                          "git": {"commit": "1a2b3c4d5e6f7a8b9c0d", "dirty": True}},
            "triton": {"version": None, "path": None, "from_installed_distribution": True, "git": None}}
MACHINE = {"cpu_model": "Example CPU", "cpu_count": 2, "gpu_count": 0, "gpu_name": None, "cuda": None, "nccl": None}
SUITE = {"git": {"commit": "0123456789abcdef0123", "dirty": False}}
CAPABILITIES = {"cuda": "a CUDA device; none is visible", "cpu_fp16": None}
ENVIRONMENT = (PACKAGES, MACHINE, SUITE, CAPABILITIES, {"gpu_count": 0})


def _check(name, step, rank, ratio, passed=True, micro=0, bound=1e-6, detail=""):
    measured = ratio * bound if ratio is not None else None
    return {"name": name, "step": step, "micro": micro, "rank": rank, "passed": passed, "measured": measured,
            "bound": bound, "margin": None if measured is None else bound - measured, "ratio": ratio,
            "detail": detail}


def _case(case_id, verdict, checks, **fields):
    ratios = [c["ratio"] for c in checks if c.get("ratio") is not None and c.get("bound")]
    return {"id": case_id, "subject": "synthetic", "axes": {"dtype": "bf16", "seed": 0}, "verdict": verdict,
            "seconds": 0.25, "mode": "cpu ranks over gloo", "checks": len(checks),
            "failed_checks": sum(not c["passed"] for c in checks), "worst_ratio": max(ratios) if ratios else None,
            "first_failure": None, "reason": None, "repro": f"parity run --case {case_id}", "rank_errors": {},
            "check_results": checks, **fields}


def made_by_hand() -> list[dict]:
    nonfinite = [_check("logits", 0, 0, 0.2), _check("logits", 1, 0, float("inf"), passed=False, detail="inf"),
                 _check("loss", 1, 1, float("nan"), passed=False, detail="nan in the loss: naïve ≠ exact"),
                 {**_check("grad[w]", 1, 0, None), "bound": 0.0, "measured": 0.0, "margin": 0.0},
                 # How results.jsonl folds ranks: a nan first, ties (the first is kept), a failure without a ratio.
                 _check("weight[w]", 2, 0, float("nan")), _check("weight[w]", 2, 1, 0.3), _check("weight[w]", 2, 2, 0.3),
                 _check("bias[b]", 2, 0, 0.2), _check("bias[b]", 2, 1, 0.2, micro=1),
                 {**_check("grad[b]", 2, 0, None), "passed": False, "detail": "no ratio"},
                 _check("grad[b]", 2, 1, 0.9, passed=False, detail="over"), _check("grad[b]", 2, 2, 0.1)]
    many = [_check(f"grad[layer{i}.weight]", step, rank, 0.05 * (i + 1) * (1 + step) / 4)
            for i in range(14) for step in range(3) for rank in (0, 1)]
    return [
        _case("hand-nonfinite", "failed", nonfinite, first_failure="logits [step=1 micro=0 rank=0]: inf"),
        _case("hand-many-tensors", "passed", many),
        _case("hand-skip", "skipped", [], reason="needs a CUDA device; none is visible"),
        _case("hand-harness-error", "failed", [], first_failure="harness error:\nTraceback (most recent call last):\n"
              "  File \"x.py\", line 1\nRuntimeError: rank 1 exited with status -9",
              rank_errors={"1": {"type": "RuntimeError", "message": "exited with status -9"}}),
        _case("hand-xpassed", "xpassed", [_check("loss", 0, 0, 0.1)], reason="documented divergence no longer seen"),
        *[_case(f"hand-near-{i}", "passed", [_check("logits", s, 0, 0.5 + 0.01 * i + 0.001 * s) for s in range(4)])
          for i in range(4)],
    ]


def records() -> list[dict]:
    with gzip.open(RECORDS, "rt") as f:
        return json.load(f) + made_by_hand()


def write(directory, **options) -> None:
    """The report of records() in directory, as any tree's writer makes it under the fixed
    environment; options: more of write_report's keyword arguments."""
    from parity.report import html
    from parity.report.console import write_report

    with ExitStack() as stack:
        stack.enter_context(mock.patch("platform.python_version", return_value="3.11.0"))
        stack.enter_context(mock.patch("platform.machine", return_value="x86_64"))
        stack.enter_context(mock.patch.object(html, "MAX_PLOTTED_CASES", MAX_PLOTTED))
        write_report(directory, records(), 12.5, ["parity", "run", "--report", "DIR"], gathered=ENVIRONMENT, **options)


def plotting_versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in PLOTTING}


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        write(tmp)
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            with gzip.GzipFile(GOLDEN / f"{name}.gz", "wb", mtime=0) as out:
                out.write((Path(tmp) / name).read_bytes())
    (GOLDEN / "versions.json").write_text(json.dumps(plotting_versions(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
