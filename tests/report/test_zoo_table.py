"""docs/zoo-compat.md is the generator's output from the committed full-zoo summary, one row per architecture of the
installed transformers' causal-LM mapping."""
import json
import re
from pathlib import Path

from parity.report import zoo_table

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "zoo-compat.md"


def committed_summary() -> Path:
    """The summary the table names in its Regenerate line."""
    match = re.search(r"python -m parity\.report\.zoo_table (\S+) docs/zoo-compat\.md", TABLE.read_text())
    assert match, "docs/zoo-compat.md names no summary to regenerate from"
    return ROOT / match.group(1)


def test_table_is_the_generator_output_of_the_committed_summary():
    summary = committed_summary()
    rendered = zoo_table.render(json.loads(summary.read_text()), str(summary.relative_to(ROOT)))
    assert rendered == TABLE.read_text(), "stale: rerun the Regenerate line of docs/zoo-compat.md"


def test_table_rows_are_the_installed_mapping():
    from importlib.util import find_spec

    from tests.conftest import skip_or_fail

    if find_spec("transformers") is None:
        skip_or_fail("transformers is not installed (pip install -e '.[hf]'): the zoo's mapping cannot be read")
    from references import zoo

    rows = [line.split("|")[1].strip() for line in TABLE.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| architecture")]
    assert rows == [model_type for model_type, _ in zoo.architectures()]


def test_a_column_per_path_read_at_fp32_tp2_zero0():
    """Each path is one column; a path's cell reads its TP-2 fp32 ZeRO-0 case (a run holding TP 3 too changes
    nothing; the transformers TP path has no ZeRO axis), and the preset columns say "no preset" outside the preset
    families."""
    def case(subject, arch, verdict, **axes):
        return {"subject": subject, "verdict": verdict,
                "axes": {"arch": arch, "dtype": "fp32", "zero": 0, "tp": 2, **axes}}

    summary = {"cases": [case("zoo_heuristic", "llama", "failed", tp=3, vocab_parallel_lm_head="false"),
                         case("zoo_heuristic", "llama", "passed", vocab_parallel_lm_head="false"),
                         case("zoo_preset", "llama", "passed", vocab_parallel_lm_head="true"),
                         {"subject": "zoo_transformers_tp", "verdict": "passed",
                          "axes": {"arch": "llama", "dtype": "fp32", "tp": 2}}]}
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in zoo_table.render(summary, "s.json").splitlines() if line.startswith("| ")}
    assert rows["architecture"] == [path for path, _, _ in zoo_table.PATHS]
    assert rows["llama"] == ["not in this run", "not in this run", "passed", "not in this run", "not in this run",
                             "passed", "passed"]
    assert rows["gpt2"][4:] == ["no preset", "no preset", "not in this run"]
