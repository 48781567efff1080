"""One case's outcome: passed, failed or skipped, with the evidence."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from parity.matrix.cases import Case
from parity.settings import RunSettings

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
# A known divergence that showed up as declared, and one that unexpectedly matched the reference.
DIVERGED, XPASSED = "diverged", "xpassed"
STATUSES = (PASSED, FAILED, SKIPPED, DIVERGED, XPASSED)
# Each known divergence a case is marked with, judged on the checks it explains.
PRESENT, FIXED = "present", "fixed"


@dataclass
class Verdict:
    case: Case
    status: str
    seconds: float = 0.0
    checks: list = field(default_factory=list)
    reason: str = ""  # why skipped, or a one-line failure summary
    rank_errors: dict = field(default_factory=dict)  # rank -> parity.harness.rank_pool.RankError
    mode: str = ""  # how the ranks ran, e.g. "2 ranks sharing cuda:0 over gloo"
    observed: dict = field(default_factory=dict)  # facts worth reading in the summary, e.g. backends that ran
    # The reproducer's environment (subject modules, a planted mutant, visible GPUs) and strict mode (skips fail).
    env: dict = field(default_factory=dict)
    strict: bool = False
    # Seconds by phase (parity.harness.timing) for --profile; never in as_dict(): results must not depend on speed.
    timing: dict = field(default_factory=dict)
    # finding (mark name) -> PRESENT or FIXED, for a case under known divergences (parity.harness.runner)
    findings: dict = field(default_factory=dict)

    @property
    def failed_checks(self) -> list:
        return [c for c in self.checks if not c.passed]

    @property
    def first_failure(self) -> str:
        if self.failed_checks:
            return self.failed_checks[0].describe()
        return self.reason

    @property
    def worst_ratio(self) -> float | None:
        ratios = [c.ratio for c in self.checks if c.ratio is not None and c.bound]
        return max(ratios) if ratios else None

    def repro(self) -> str:
        from parity.matrix.cases import default_files

        source = self.case.source.rsplit(":", 1)[0]
        in_default = any(str(f).endswith("/" + source) or str(f) == source for f in default_files())
        matrix = "" if in_default else f" --matrix {shlex.quote(source)}"
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(self.env.items()))
        strict = " --strict" if self.strict else ""
        return f"{env}parity run{matrix} --case {self.case.id}{strict}"

    def explain(self) -> str:
        """Everything a person needs to act on a failure."""
        lines = [f"{self.case.id}: {self.status.upper()} - {self.first_failure}"]
        for c in self.failed_checks[:10]:
            lines.append(f"  check failed: {c.describe()}")
        if len(self.failed_checks) > 10:
            lines.append(f"  ... {len(self.failed_checks) - 10} more failed checks")
        for rank, err in sorted(self.rank_errors.items()):
            lines.append(f"  rank {rank}: {err.type}: {err.message}")
            lines.extend("    " + line for line in err.traceback.rstrip().splitlines()[-25:])
        lines.append(f"  reproduce: {self.repro()}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {**self.case.as_dict(), "verdict": self.status, "seconds": round(self.seconds, 3),
                "mode": self.mode or None, "observed": self.observed or None, "checks": len(self.checks), "failed_checks": len(self.failed_checks),
                "worst_ratio": self.worst_ratio,
                "first_failure": self.first_failure if self.status == FAILED else None,
                "reason": self.reason or None, "repro": self.repro(), "findings": self.findings or None,
                "rank_errors": {str(r): {"type": e.type, "message": e.message} for r, e in self.rank_errors.items()},
                # Every check, in the order it ran (chronological: setup, then step by step): what
                # results.jsonl and report.html are written from (parity.report.console.write_report).
                "check_results": [c.as_dict() for c in self.checks]}


def repro_env(case: Case, settings: RunSettings) -> dict:
    """The variables that decide what a case runs, as the run that ran it had them (its settings'
    subject modules and mutant: the mutation check's runners each carry their own mutant)."""
    env = settings.repro_env()
    if case.values.optional("device", "cpu") == "cuda" and os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return env
