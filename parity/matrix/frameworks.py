"""The README's cross-framework table: per feature and framework, how many cases of each expected outcome.

Generated from the case files like the coverage table (parity/matrix/coverage.py) and kept current by
tests/matrix/test_frameworks.py. A cell is "parity / known div. / rejection": the outcome the case file
declares, not a run's result. Every subject of parity.subjects is either mapped to a feature here or
named in OTHER, so a new head subject cannot drop out of the table unnoticed.
"""
from __future__ import annotations

from collections import Counter

BEGIN, END = "<!-- frameworks:begin -->", "<!-- frameworks:end -->"
COLUMN, VOCAB, ROW, EMBED, TIED = ("column head (gathered logits)", "vocab-parallel head + CE", "row head",
                                   "vocab-parallel embedding", "tied embedding / head")
FEATURES_IN_ORDER = (COLUMN, VOCAB, ROW, EMBED, TIED)
# Columns: Subject.framework -> header. Liger has only a loss (no head), so it is no column.
FRAMEWORK_COLUMNS = {"deepspeed": "DeepSpeed", "torch": "PyTorch DTensor", "megatron": "Megatron-core"}
FEATURES = {
    "column_gathered": COLUMN, "direct_column_gathered": COLUMN, "hf_plan_column": COLUMN,
    "torch_column_gathered": COLUMN, "megatron_column_gathered": COLUMN,
    "vocab_parallel": VOCAB, "direct_vocab_parallel": VOCAB, "torch_vocab_parallel": VOCAB,
    "megatron_vocab_parallel": VOCAB,
    "row_parallel": ROW, "direct_row_parallel": ROW, "hf_plan_row": ROW, "torch_row_parallel": ROW,
    "vocab_parallel_embedding": EMBED, "torch_vocab_embedding": EMBED, "megatron_vocab_embedding": EMBED,
    "tied_row_parallel": TIED, "tied_vocab_parallel": TIED, "tied_column_gathered": TIED, "tied_plan_head": TIED,
    "hf_plan_tied": TIED,
}
# Subjects that are no head feature of the table: losses alone, error paths, inference, an embedding spec, and how
# DeepSpeed finds the head (spec_reach, preset_llama, heuristic_blocks: DeepSpeed's module selection, no other
# framework has it), and DeepSpeed's universal checkpoint (uc_*: a save / convert / resume path, not a head's arithmetic).
OTHER = {"liger_vocab_ce", "ds_vocab_ce", "ds_liger_ce", "ds_liger_no_group", "ds_fused_linear_ce", "ds_reject",
         "ds_vocab_logprobs", "ds_vocab_entropy", "ds_vocab_kl", "ds_vocab_ce_module", "ds_vocab_seq_ce",
         "inference_head", "embed_spec_untied", "spec_reach", "preset_llama", "heuristic_blocks",
         "uc_column_gathered", "uc_vocab_parallel", "uc_row_parallel"}


def feature(case) -> str | None:
    """A case's feature: its subject's, except that a tied case of an embedding subject is the tied feature."""
    found = FEATURES.get(case.subject)
    if found == EMBED and case.values.get("tied"):
        return TIED
    return found


def _outcome(case) -> str:
    return "rejection" if case.expect.is_error else "divergence" if case.divergence else "parity"


def framework_table(cases) -> str:
    from parity.subjects import SUBJECTS

    counts = {}
    for c in cases:
        feat, fw = feature(c), SUBJECTS[c.subject].framework
        if feat and fw in FRAMEWORK_COLUMNS:
            counts.setdefault((feat, fw), Counter())[_outcome(c)] += 1
    header = ["feature"] + list(FRAMEWORK_COLUMNS.values())
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for feat in FEATURES_IN_ORDER:
        cells = []
        for fw in FRAMEWORK_COLUMNS:
            k = counts.get((feat, fw))
            cells.append(f"{k['parity']} / {k['divergence']} / {k['rejection']}" if k else "-")
        lines.append("| " + " | ".join([feat] + cells) + " |")
    return "\n".join(lines)


def readme_block(cases) -> str:
    return f"{BEGIN}\n{framework_table(cases)}\n{END}"
