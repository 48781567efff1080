"""The zoo compatibility table (docs/zoo-compat.md): every architecture x zoo subject of one run's summary.json.

Usage: ``python -m parity.report.zoo_table SUMMARY.json OUT.md``. A cell reads passed, diverged (the finding: its
reproducer's name), refused (the case file's expected error, or one of deepspeed.initialize's refusals, REFUSALS),
cannot run (the skip reason), or failed (the error raised or the first failing check, not yet explained). Rows are the installed transformers' architectures (parity/axes.py).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from parity.axes import ARCHITECTURES

# The table's columns: (heading, subject, the axis values of that path's cases). cases/zoo/full.toml runs each at
# fp32, TP 2, ZeRO 0; cases/zoo/full_transformers_tp.toml at fp32, TP 2 (it has no ZeRO axis).
PATHS = (
    ("hf plan", "zoo_hf_plan", {}),
    ("hf plan, vocab parallel", "zoo_vocab_parallel", {}),
    ("heuristic", "zoo_heuristic", {"vocab_parallel_lm_head": "false"}),
    ("heuristic, vocab parallel", "zoo_heuristic", {"vocab_parallel_lm_head": "true"}),
    ("preset", "zoo_preset", {"vocab_parallel_lm_head": "false"}),
    ("preset, vocab parallel", "zoo_preset", {"vocab_parallel_lm_head": "true"}),
    ("transformers tp", "zoo_transformers_tp", {}),
)
SUBJECTS = {subject for _, subject, _ in PATHS}
# The one point of each path the table reads (a run may hold more); an axis a path's cases lack is not compared.
POINT = {"dtype": "fp32", "zero": 0, "tp": 2}
REGENERATE = "python -m parity.report.zoo_table {summary} docs/zoo-compat.md"


def _short(text: str, limit: int = 110) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _last_error(reason: str) -> str:
    """The exception line of a traceback-carrying reason (its last line naming an Error/Exception), else its
    first line."""
    lines = [ln.strip() for ln in str(reason).splitlines() if ln.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt")) and " " not in head:
            return line
    return lines[0] if lines else ""


# deepspeed.initialize's and from_pretrained's own refusals, whether or not the case expected them: (error line
# fragment, cell text).
REFUSALS = (
    (re.compile(r"unsupported partition style\(s\): \[([^\]]*)\]"),
     lambda m: "unsupported plan styles " + m.group(1).replace("'", "")),
    (re.compile(r"custom embedding forward of (\w+)"), lambda m: f"custom embedding forward of {m.group(1)}"),
    (re.compile(r"Not able to determine model policy automatically"), lambda m: "no AutoTP policy for the model"),
    (re.compile(r"AutoTP not supported for model"), lambda m: "AutoTP not supported for the model"),
    (re.compile(r"vocab_parallel_lm_head requires a supported nn.Linear named 'lm_head' or 'embed_out'"),
     lambda m: "vocab_parallel_lm_head needs a head named lm_head or embed_out"),
    # transformers' from_pretrained(tp_plan="auto") on a class without a plan
    (re.compile(r"`tp_size=\d+` was requested, but `(\w+)` has no `tp_plan`"),
     lambda m: f"{m.group(1)} has no tp_plan"),
)


RANK_RAISED = re.compile(r"^rank \d+ raised ")


def _failure(record: dict) -> str:
    """A failed case: a refusal of deepspeed.initialize, else the error raised, else the first failing check."""
    text = str(record.get("first_failure") or record.get("reason") or "")
    for pattern, label in REFUSALS:
        match = pattern.search(text)
        if match:
            return f"refused ({label(match)})"
    if "died with exit code -9" in text:
        return "failed (job process killed, exit -9)"
    if text.startswith("harness error") or RANK_RAISED.match(text):
        return f"failed ({_short(RANK_RAISED.sub('', _last_error(text)))})"
    return f"failed ({_short(text.split(', margin')[0])})"


def cell(record: dict | None) -> str:
    if record is None:
        return "not in this run"
    verdict = record["verdict"]
    if verdict == "passed" and record.get("expect", "parity") == "parity":
        return "passed"
    if verdict == "passed":
        expect = record["expect"]
        return f"refused (as the case file expects: {expect.get('error')}, {_short(expect.get('match', ''))})"
    if verdict == "diverged":
        repro = (record.get("known_divergence") or {}).get("repro") or ""
        return f"diverged ({Path(repro).stem or _short(record.get('reason', ''))})"
    if verdict == "skipped":
        return f"cannot run ({_short(str(record.get('reason', '')).split(': ', 1)[-1])})"
    return _failure(record)


def category(text: str) -> str:
    return text.split(" (", 1)[0]


def path_record(cases: list, subject: str, axes: dict, arch: str) -> dict | None:
    """The case of ``subject`` on ``arch`` at POINT and the path's axis values (None: not in the run)."""
    return next((c for c in cases if c["subject"] == subject and c["axes"].get("arch") == arch
                 and all(c["axes"].get(k, v) == v for k, v in {**POINT, **axes}.items())), None)


def render(summary: dict, summary_path: str) -> str:
    from parity.subjects.zoo import PRESET_OF

    cases = [c for c in summary["cases"] if c["subject"] in SUBJECTS]

    def cell_of(subject, axes, arch):
        if subject == "zoo_preset" and arch not in PRESET_OF:
            return "no preset"
        return cell(path_record(cases, subject, axes, arch))

    packages = summary.get("packages", {})
    versions = ", ".join(f"{name} {packages[name]['version']}" for name in ("torch", "deepspeed", "transformers")
                         if name in packages)
    rows = {arch: [cell_of(subject, axes, arch) for _, subject, axes in PATHS]
            for arch in ARCHITECTURES}
    counts = []
    for i, (path, _, _) in enumerate(PATHS):
        tally: dict = {}
        for cells in rows.values():
            tally[category(cells[i])] = tally.get(category(cells[i]), 0) + 1
        counts.append(f"`{path}`: " + ", ".join(f"{n} {k}" for k, n in sorted(tally.items(), key=lambda kv: -kv[1])))
    lines = [
        "# Zoo compatibility (generated)",
        "",
        f"DeepSpeed AutoTP and transformers' own TP on every causal-LM architecture of the installed transformers, "
        f"built tiny (references/zoo.py), fp32, TP 2, ZeRO 0, 5 SGD steps against the unsharded model "
        f"(cases/zoo/full.toml, cases/zoo/full_transformers_tp.toml). {versions}. "
        f"Run: `{summary.get('command', '')}`, {summary.get('wall_seconds')} s.",
        "",
        f"Regenerate: `{REGENERATE.format(summary=summary_path)}` (tests/report/test_zoo_table.py holds it current).",
        "",
        "hf plan (`zoo_hf_plan`): the model's own HF tp_plan, no partition_config; hf plan, vocab parallel "
        "(`zoo_vocab_parallel`): the same with vocab_parallel_lm_head true; heuristic (`zoo_heuristic`): the plan "
        "removed, AutoTP's heuristic parser; preset (`zoo_preset`): tensor_parallel.preset_model of the "
        "architecture's AutoTP preset family (only those rows); each with vocab_parallel_lm_head false, and true "
        "(the vocab parallel columns); transformers tp (`zoo_transformers_tp`): transformers' own tensor parallelism, "
        "from_pretrained(tp_plan=\"auto\") on DTensor, no DeepSpeed. not in this run: the summary holds no such case. "
        "passed: every check holds; diverged: a known finding (its reproducer); refused: deepspeed.initialize refused "
        "the model (unsupported plan styles, no AutoTP policy, an embedding it cannot shard), or from_pretrained did "
        "(a class without a tp_plan); cannot run: skipped, the census reason; failed: not yet explained (a check or "
        "an error).",
        "",
        *(f"- {c}" for c in counts),
        "",
        "| architecture | " + " | ".join(path for path, _, _ in PATHS) + " |",
        "|---|" + "---|" * len(PATHS),
        *(f"| {arch} | " + " | ".join(cells) + " |" for arch, cells in rows.items()),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    summary_path, out = args
    Path(out).write_text(render(json.loads(Path(summary_path).read_text()), summary_path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
