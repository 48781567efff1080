"""The mutation check: plant each bug of parity.mutation.catalog and demand that the suite fails.

    python ci/mutation_check.py [--fast] [--mutant NAME ...] [--json PATH] [--all-cases]
    python -m parity.cli mutants ...            (the same)

1. Baseline: a small selection of cases per family (subject) from the default matrix must be
   green; otherwise the check stops (a red baseline would "kill" every mutant).
2. Each mutant runs against the selected cases of every family it applies to, in a fresh
   rank group (rank mutants are applied at rank start, named by the run settings; reference mutants
   are applied in this process, where the references run).
3. A (mutant, family) cell is KILLED only when a case's verdict is failed with failed parity
   checks. A crash, timeout or rank error is "crashed", not a kill. By default a cell stops at its
   first killing case (--all-cases runs every case, for the per-case evidence).

Exit status: 0 when every mutant not documented as equivalent is killed in every family it
applies to and no equivalent mutant is killed (a killed equivalent mutant is a false alarm: the
suite rejected a correct implementation); 1 otherwise; 2 when the baseline is not green or an
argument is bad (an unknown --mutant).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from parity.mutation import catalog
from parity.checks.verdict import DIVERGED, FAILED, PASSED, XPASSED

# Verdicts of a case that hold the subject to the reference: passed, or diverged exactly as its case
# file documents (only the named checks fail). A baseline case may be either; a mutant that leaves a
# case in either (or turns a documented divergence into an xpass) has broken no parity check.
AS_DOCUMENTED = (PASSED, DIVERGED)

# Per family: a spread over dtype, reduction, even/uneven vocab, hidden, bias, head name, ZeRO stage.
# Every family has bias cases (for the bias mutants), a mean and a num_items/none case, an uneven
# vocabulary (35 over tp=2) and low precision.
SELECTION = {
    catalog.COLUMN: [
        "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",
        "column_gathered-bf16-num_items-v269-h32-bias-embed_out-ign_scattered-zero2-gas2-tp2-cpu",
        "column_gathered-fp32-none-v34-h35-bias-embed_out-ign_scattered-zero2-gas2-tp2-cpu",
        "column_gathered-fp16-sum-v35-h35-nobias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",
        # bf16 under ZeRO 0 (FP16_UnfusedOptimizer), for the precision-only optimizer mutant where fp16
        # engines cannot run; a documented divergence (contract[grad]) that a mutant must push further.
        "column_gathered-bf16-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",
        # fp16 dynamic loss scale with DeepSpeed's default hysteresis (the hysteresis mutant): a documented divergence
        # from GradScaler's skips that a mutant must push further.
        "column_gathered-fp16-mean-v34-h32-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-ls_dyn19",
    ],
    catalog.VOCAB: [
        "vocab_parallel-torch-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",
        "vocab_parallel-torch-bf16-num_items-v269-h32-bias-embed_out-ign_scattered-zero2-gas2-tp2-cpu",
        "vocab_parallel-torch-fp32-num_items-v34-h35-bias-embed_out-ign_scattered-zero2-gas2-tp2-cpu",
        "vocab_parallel-torch-fp16-mean-v35-h35-nobias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",
        "vocab_parallel-torch-bf16-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",  # as above
        # pre-shifted labels: the only ones a loss that drops shift_labels gets wrong
        "vocab_parallel-torch-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-shiftlbl",
    ],
    # The other subjects: two TP=2 cases each (one fp32, one low precision; bias; even and uneven),
    # enough for their mutants; world 2 so one rank group serves every family of a mutant.
    catalog.ROW: [
        "row_parallel-fp32-mean-v35-h35-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu",
        "row_parallel-bf16-num_items-v35-h32-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu",
    ],
    catalog.TIED_ROW: [
        "tied_row_parallel-fp32-mean-v35-h35-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-nopad-espec_none",
        "tied_row_parallel-bf16-mean-v35-h32-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-padlast-espec_none",
        "tied_row_parallel-fp32-mean-v35-h35-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-padlast-espec_none-sgbf",
        "tied_row_parallel-bf16-mean-v35-h35-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-nopad-espec_none-escale_gemma3",
    ],
    catalog.TIED_VOCAB: [
        "tied_vocab_parallel-torch-fp32-mean-v35-h35-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-nopad-espec_none",
        "tied_vocab_parallel-torch-bf16-mean-v34-h35-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-padlast-espec_none",
        "tied_vocab_parallel-torch-fp32-mean-v35-h35-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-padlast-espec_none-escale_gemma3",
    ],
    catalog.EMBED: [
        "vocab_parallel_embedding-fp32-v35-h32-gas2-tp2-cpu-nopad",
        "vocab_parallel_embedding-bf16-v34-h32-gas2-tp2-cpu-padlast",
        "vocab_parallel_embedding-bf16-v35-h32-gas2-tp2-cpu-pad0-escale_gemma3",
    ],
    catalog.DS_LOGPROBS: ["ds_vocab_logprobs-fp32-v35-ign_scattered-tp3-cpu",
                          "ds_vocab_logprobs-bf16-v35-ign_scattered-tp2-cpu",
                          "ds_vocab_logprobs-fp32-v35-ign_scattered-tp3-cpu-top4"],
    catalog.DS_ENTROPY: ["ds_vocab_entropy-fp32-v35-tp3-cpu"],
    catalog.DS_KL: ["ds_vocab_kl-fp32-kl_rev-v32-grad_both-tshard_same-tp3-cpu",
                    "ds_vocab_kl-bf16-kl_rev-v35-grad_student-tshard_same-tp3-cpu"],
    catalog.DS_CE_MODULE: ["ds_vocab_ce_module-fp32-sum-v35-ign_scattered-ignidx0-torch-tp3-cpu"],
    catalog.DS_CE: [
        "ds_vocab_ce-fp32-mean-v35-ign_scattered-tp2-cpu",
        "ds_vocab_ce-bf16-none-v269-ign_scattered-tp2-cpu",
        "ds_vocab_ce-bf16-mean-v35-ign_scattered-tp2-cpu",  # a low-precision reduction (precision-only mutants)
        "ds_vocab_ce-fp32-mean-v32-ign_scattered-tp2-sp2-cpu",  # TP x SP (world 4): the SP reductions
    ],
    catalog.DS_SEQ_CE: [
        "ds_vocab_seq_ce-fp32-none-v32-ign_scattered-tp2-sp2-gseq-cpu",
        "ds_vocab_seq_ce-bf16-mean-v35-ign_scattered-tp2-sp2-cpu",
    ],
    catalog.FUSED_CE: [
        "ds_fused_linear_ce-fp32-sum-v36-bias-chunk5-ign_scattered-tp2-cpu",
        "ds_fused_linear_ce-bf16-mean-v35-nobias-chunk5-ign_scattered-tp2-cpu",
        "ds_fused_linear_ce-bf16-none-v35-bias-chunk5-ign_scattered-tp2-cpu",  # per-token losses as handed back
        "ds_fused_linear_ce-fp32-mean-v36-bias-ign_scattered-tp2-sp2-cpu",  # TP x SP (world 4): the SP reductions
        # inside the user's torch.autocast (bf16): the GEMMs' precision (gemm_dtype)
        "ds_fused_linear_ce-fp32-mean-v35-nobias-chunk5-ign_scattered-tp2-cpu-autocast_bf16",
    ],
    catalog.LIGER_CE: [
        "liger_vocab_ce-fp32-v32-ign_scattered-tp2-cpu",
        "liger_vocab_ce-bf16-v64-ign_none-tp2-cpu",
    ],
    # Subjects merged after the first catalog: one or two cases each (rank start-up dominates).
    catalog.D_COLUMN: ["direct_column_gathered-fp32-mean-v34-h32-bias-lm_head-ign_scattered-gas2-tp2-cpu"],
    catalog.D_VOCAB: ["direct_vocab_parallel-fp32-mean-v34-h32-bias-lm_head-ign_scattered-gas2-tp2-cpu"],
    catalog.D_ROW: ["direct_row_parallel-fp32-mean-v35-h32-bias-lm_head-ign_scattered-gas2-tp2-cpu"],
    catalog.DS_LIGER: ["ds_liger_ce-fp32-v32-ign_scattered-tp2-cpu"],
    catalog.DS_LIGER_NO_GROUP: ["ds_liger_no_group-fp32-v32-ign_scattered-tp2-cpu"],
    catalog.INFERENCE: ["inference_head-fp32-v34-h32-untied-bias-lm_head-tp2-grain64-cpu"],
    catalog.REJECT: ["ds_reject-vocab_empty_shard-tp2-cpu"],
    catalog.TIED_COLUMN: [
        "tied_column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-padlast-espec_none",
        "tied_column_gathered-bf16-mean-v35-h32-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-padlast-espec_row",
    ],
    # The custom-named head first (the tie fallback), then the lm_head twin the auto path makes vocab-parallel.
    catalog.TIED_PLAN: [
        "tied_plan_head-fp32-mean-v35-h32-bias-output-ign_scattered-zero0-gas2-tp2-cpu-vplm_unset-padlast",
        "tied_plan_head-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-vplm_unset-padlast",
    ],
    catalog.HF_COLUMN: ["hf_plan_column-fp32-mean-v34-ign_scattered-zero0-gas2-tp2-cpu-plan_colwise_gather_output"],
    catalog.HF_ROW: ["hf_plan_row-fp32-mean-v34-ign_scattered-zero0-gas2-tp2-cpu"],
    catalog.HF_TIED: ["hf_plan_tied-fp32-mean-v34-ign_scattered-zero0-gas2-tp2-cpu-vplm_true"],
    catalog.T_COLUMN: ["torch_column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-gas2-tp2-cpu"],
    catalog.T_VOCAB: ["torch_vocab_parallel-fp32-mean-v35-h32-bias-lm_head-ign_scattered-gas2-tp2-cpu"],
    catalog.T_ROW: ["torch_row_parallel-fp32-mean-v35-h35-bias-lm_head-ign_scattered-gas2-tp2-cpu"],
    catalog.T_EMBED: ["torch_vocab_embedding-fp32-mean-v35-h32-bias-lm_head-ign_scattered-gas2-tp2-cpu-untied"],
    catalog.EMBED_SPEC: ["embed_spec_untied-fp32-mean-v34-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-nopad-espec_row"],
}
# TP=2 x DP=2 (world 4): the one case where the world group is not the TP group. Last in its
# family, so only mutants that survive the TP-only cases (column_backward_world_group) pay for a
# world-4 rank group; --fast leaves it out.
SELECTION.update({
    # CUDA only (Megatron's all-gather allocates on torch.cuda.current_device()): judged on a GPU machine.
    catalog.M_COLUMN: ["megatron_column_gathered-fp32-mean-v36-h32-bias-ign_scattered-gas2-tp2-cuda"],
    catalog.M_VOCAB: ["megatron_vocab_parallel-bf16-mean-v36-h32-bias-ign_scattered-gas2-tp2-cpu"],
    catalog.M_EMBED: ["megatron_vocab_embedding-fp32-mean-v36-h32-bias-ign_scattered-gas2-tp2-cpu-untied"],
})
SELECTION.update({
    catalog.ZOO_PLAN: ["zoo_hf_plan-arch_llama-v125-fp32-zero0-gas2-tp2-cpu"],
    catalog.ZOO_VOCAB: ["zoo_vocab_parallel-arch_llama-v125-fp32-zero0-gas2-tp2-cpu"],
    catalog.ZOO_HEURISTIC: ["zoo_heuristic-arch_llama-v125-fp32-zero0-gas2-tp2-cpu-vplm_false"],
    catalog.ZOO_PRESET: ["zoo_preset-arch_llama-v125-fp32-zero0-gas2-tp2-cpu-vplm_false"],
    catalog.ZOO_TRANSFORMERS: ["zoo_transformers_tp-arch_llama-v125-fp32-gas2-tp2-cpu"],
})
SELECTION.update({
    catalog.SPEC_REACH: ["spec_reach-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero2-gas2-tp2-cpu-reach_model_types_config"],
    catalog.PRESET: ["preset_llama-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-vplm_true"],
    # The head registered in a block, which the block walk makes a gathered column LinearLayer (vocab_parallel_lm_head
    # false): the gather mutant's case in this family.
    catalog.HEURISTIC: ["heuristic_blocks-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-vplm_true",
                        "heuristic_blocks-fp32-mean-v35-h32-bias-layers_1_lm_head-ign_scattered-zero0-gas2-tp2-cpu-vplm_false"],
})
SELECTION.update({
    # Resumed at the saving TP (a rank > 0 must get its own slice back) and at another (tp 2 -> tp 1 x dp 2).
    catalog.UC_VOCAB: ["uc_vocab_parallel-bf16-mean-v35-h8-bias-zero1-gas2-from_tp2-tp2-adamw-cpu-lm_head",
                       "uc_vocab_parallel-fp32-mean-v35-h8-bias-zero1-gas2-from_tp2-tp1-dp2-adamw-cpu-lm_head"],
    catalog.UC_COLUMN: ["uc_column_gathered-fp32-mean-v35-h8-bias-zero1-gas2-from_tp2-tp2-adamw-cpu"],
    catalog.UC_ROW: ["uc_row_parallel-fp32-mean-v35-h9-bias-zero1-gas2-from_tp2-tp2-adamw-cpu"],
})
SELECTION[catalog.COLUMN].append(
    "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-dp2-cpu")
# --fast (CI self-test): three mutants, two cases each; one DeepSpeed layer bug, one CE bug, one
# reference bug, so each of the three application paths is exercised.
FAST_MUTANTS = {"column_backward_no_allreduce": catalog.COLUMN, "ce_local_sum_exp": catalog.VOCAB,
                "reference_no_causal_shift": catalog.COLUMN}
FAST_CASES = 2

KILLED, SURVIVED, CRASHED = "killed", "survived", "crashed"
NOT_RUN_HERE = "not run here"  # a family none of whose cases this machine can run (kill matrix cell)


def _case_outcome(verdict) -> dict:
    failed = verdict.failed_checks
    if verdict.status == FAILED and failed:
        outcome = KILLED
    elif verdict.status in AS_DOCUMENTED + (XPASSED,):
        outcome = SURVIVED
    else:  # failed without a failed check: rank error, timeout, harness error, no check ran; or skipped
        outcome = CRASHED if verdict.status == FAILED else "skipped"
    return {"case": verdict.case.id, "outcome": outcome, "verdict": verdict.status,
            "seconds": round(verdict.seconds, 2), "failed_checks": len(failed),
            "first_failure": verdict.first_failure if verdict.status == FAILED else None}


def _cell_status(case_results: list[dict]) -> str:
    outcomes = [r["outcome"] for r in case_results]
    if KILLED in outcomes:
        return KILLED
    if CRASHED in outcomes:
        return CRASHED
    return SURVIVED


def run_cases(groups, timeout_s: float, stop_at_kill: bool, mutant=None, clean_runner=None,
              log_dir: str | None = None) -> list[dict]:
    """Run groups of cases with ``mutant`` planted where it belongs; with stop_at_kill, a group
    stops at its first killing case. A rank mutant gets a fresh Runner (fresh rank groups, started
    with run settings naming it); a parent (reference) mutant may reuse ``clean_runner``, whose ranks
    are unmutated: the ranks are not what it changes."""
    from parity.harness.runner import Runner, run_settings

    if mutant is not None and mutant.where == "rank":
        clean_runner = None
    # Named for a parent mutant too: ranks ignore it (apply_named(..., "rank")), and each failing
    # case's reproducer then carries it (`parity run` applies a parent mutant from it).
    runner = clean_runner or Runner(run_settings(
        timeout_s=timeout_s, mutant=mutant.name if mutant else "",
        log_dir=os.path.join(log_dir, mutant.name) if log_dir and mutant else log_dir))
    undo = None
    if mutant is not None and mutant.where != "rank":
        undo = mutant.apply()
        # References are shared between a runner's cases (checks.compare.ReferenceCache): ones
        # computed before this mutant was planted would hide it, and ones computed under it must
        # not outlive it.
        runner.references.clear()
    results = []
    try:
        for cases in groups:
            for case in cases:
                results.append(_case_outcome(runner.run(case)))
                if stop_at_kill and results[-1]["outcome"] == KILLED:
                    break
    finally:
        if runner is not clean_runner:
            runner.close()
        if undo is not None:
            undo()
            runner.references.clear()
    return results


def select_cases(families, per_family: int | None) -> dict:
    from parity.matrix.cases import load
    from parity.subjects import SUBJECTS

    by_id = {c.id: c for c in load()}
    out = {}
    for fam in families:
        # A family without a selection here (a subject module's own, PARITY_SUBJECT_MODULES) takes its subject's
        # cases of the default matrix.
        chosen = SELECTION.get(fam) or [c.id for c in by_id.values() if c.subject == fam]
        ids = chosen[:per_family] if per_family else chosen
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise SystemExit(f"mutation check: case {missing[0]!r} is not in the default matrix")
        runnable = []
        for case in (by_id[i] for i in ids):
            # A case this machine cannot run (e.g. fp16 engines without oneDNN fp16) can neither
            # pass the baseline nor kill a mutant: it is left out, and said so.
            why = SUBJECTS[case.subject].unavailable_reason(case.values)
            if why:
                print(f"not run here: {case.id}: {why}", flush=True)
            else:
                runnable.append(case)
        if not runnable:
            # A family this machine cannot run at all (megatron_column_gathered: CUDA only) is left out,
            # said so, and shown as NOT RUN HERE in the kill matrix; it is judged where it runs.
            print(f"mutation check: family {fam!r} is not judged here: none of its cases can run on this machine",
                  flush=True)
            continue
        out[fam] = runnable
    return out


def kill_matrix_text(rows: list[dict]) -> str:
    families = list(catalog.families())
    width = max(len(r["mutant"]) for r in rows) + 2
    families = [f for f in families if any(f in r["cells"] for r in rows)]
    cw = {f: len(f) + 2 for f in families}
    head = f"{'mutant':<{width}}" + "".join(f"{f:<{cw[f]}}" for f in families) + "expected"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = ""
        for f in families:
            cell = r["cells"].get(f)
            cells += f"{'-' if cell is None else cell['status']:<{cw[f]}}"
        lines.append(f"{r['mutant']:<{width}}{cells}{'survive (equivalent)' if r['equivalent'] else 'killed'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mutation_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


# Exit statuses: 1 a mutant survived (or an equivalent one was killed); 2 bad input, as every parity
# command; 3 the unmutated baseline is not green, so nothing was judged: a CI job must tell "the suite
# missed a bug" from "the suite or the machine is broken", which one shared status could not.
BASELINE_RED = 3


def add_arguments(parser) -> None:
    """Shared by ci/mutation_check.py and `parity mutants`."""
    parser.add_argument("--fast", action="store_true", help="3 mutants x 2 cases (CI)")
    parser.add_argument("--mutant", action="append", metavar="NAME", help="only this mutant (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="write the kill matrix and per-case evidence here")
    parser.add_argument("--all-cases", action="store_true", help="do not stop a cell at its first kill")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a case may take on its ranks")
    parser.add_argument("--list", action="store_true", help="print the catalog and exit")
    parser.add_argument("--logs", metavar="DIR", help="rank logs: DIR/baseline, DIR/<mutant> (default: a temp dir)")


def run(args) -> int:
    every = catalog.mutants()
    unknown = [n for n in args.mutant or () if n not in catalog.BY_NAME]
    if unknown:
        print(f"mutation check: unknown mutant {unknown[0]!r} (--list shows the catalog)", file=sys.stderr)
        return 2
    if args.list:
        for m in every:
            eq = f"  [equivalent: {m.equivalent}]" if m.equivalent else ""
            print(f"{m.name} ({m.where}; {', '.join(m.families)}; caught by {m.observable})\n"
                  f"    replaces {m.replaces}\n    {m.description}{eq}")
        return 0

    start = time.monotonic()
    if args.fast:
        plan = [(catalog.get(n), (fam,)) for n, fam in FAST_MUTANTS.items()]
        per_family = FAST_CASES
    else:
        plan = [(m, m.families) for m in every]
        per_family = None
    if args.mutant:
        plan = [(catalog.get(n), catalog.get(n).families) for n in args.mutant] if not args.fast else \
            [p for p in plan if p[0].name in args.mutant]
    families = sorted({f for _, fams in plan for f in fams}, key=catalog.families().index)
    cases = select_cases(families, per_family)
    not_here = [f for f in families if f not in cases]
    families = [f for f in families if f in cases]
    if not families:
        # Nothing can be judged here: like a red baseline, the machine (not the input) is the problem.
        print("mutation check: no selected family can run on this machine", file=sys.stderr)
        return BASELINE_RED

    print(f"baseline: {sum(len(c) for c in cases.values())} cases over {', '.join(families)}", flush=True)
    from parity.harness.runner import Runner, run_settings

    if not args.logs:
        import tempfile

        args.logs = tempfile.mkdtemp(prefix="parity-mutants-")
    # No mutant in the baseline's ranks, whatever PARITY_MUTANT says (run_cases names each mutant).
    clean = Runner(run_settings(timeout_s=args.timeout, log_dir=os.path.join(args.logs, "baseline"), mutant=""))
    try:
        return _check(args, plan, families, cases, clean, start, not_here)
    finally:
        clean.close()


def _check(args, plan, families, cases, clean, start, not_here=()) -> int:
    baseline = run_cases([cases[f] for f in families], args.timeout, stop_at_kill=False, clean_runner=clean)
    not_green = [r for r in baseline if r["verdict"] not in AS_DOCUMENTED]
    for r in baseline:
        print(f"  {r['verdict']:<8} {r['seconds']:6.2f}s {r['case']}", flush=True)
    report = {"fast": args.fast, "families": families, "cases": {f: [c.id for c in cases[f]] for f in families},
              "baseline": baseline, "mutants": []}
    if not_green:
        print(f"baseline is not green ({len(not_green)} of {len(baseline)} cases): no mutant can be judged",
              file=sys.stderr)
        for r in not_green:
            print(f"  {r['case']}: {r['verdict']}: {r['first_failure']}", file=sys.stderr)
        report["baseline_green"] = False
        _write(args.json, report)
        return BASELINE_RED
    report["baseline_green"] = True

    rows = []
    for mutant, fams in plan:
        row = {"mutant": mutant.name, "description": mutant.description, "replaces": mutant.replaces,
               "observable": mutant.observable, "where": mutant.where, "equivalent": mutant.equivalent,
               "cells": {}}
        t0 = time.monotonic()
        # A mutant only some cases can kill (Mutant.cases) runs those; a family where none of them runs here is not judged here.
        own = {f: [c for c in cases.get(f, ()) if not mutant.cases or c.id in mutant.cases] for f in fams}
        for f in fams:
            if f in not_here or not own[f]:
                row["cells"][f] = {"status": NOT_RUN_HERE, "cases": []}
        fams = [f for f in fams if f not in not_here and own[f]]
        if not fams:
            rows.append(row)
            print(f"{mutant.name:<36} {NOT_RUN_HERE}", flush=True)
            continue
        # One Runner per mutant: both families use world size 2, so they share one fresh rank group.
        results = run_cases([own[f] for f in fams], args.timeout, stop_at_kill=not args.all_cases,
                            mutant=mutant, clean_runner=clean, log_dir=args.logs)
        for f in fams:
            fam_results = [r for r in results if r["case"].startswith(f + "-")]
            row["cells"][f] = {"status": _cell_status(fam_results), "cases": fam_results}
        row["seconds"] = round(time.monotonic() - t0, 1)
        rows.append(row)
        summary = ", ".join(f"{f}: {c['status']}" for f, c in row["cells"].items())
        killer = next((r for f in fams for r in row["cells"][f]["cases"] if r["outcome"] == KILLED), None)
        crash = next((r for f in fams for r in row["cells"][f]["cases"] if r["outcome"] == CRASHED), None)
        why = f" <- {killer['first_failure']}" if killer else (f" <- {crash['first_failure']}" if crash else "")
        print(f"{mutant.name:<36} {summary} ({row['seconds']}s){why[:160]}", flush=True)

    report["mutants"] = rows
    cells = [(r, f, c) for r in rows for f, c in r["cells"].items() if c["status"] != NOT_RUN_HERE]
    counted = [(r, f, c) for r, f, c in cells if not r["equivalent"]]
    killed = [x for x in counted if x[2]["status"] == KILLED]
    bad = [(r, f, c) for r, f, c in counted if c["status"] != KILLED]
    false_alarms = [(r, f, c) for r, f, c in cells if r["equivalent"] and c["status"] == KILLED]
    mutants_counted = [r for r in rows if not r["equivalent"] and any(c["status"] != NOT_RUN_HERE for c in r["cells"].values())]
    mutants_killed = [r for r in mutants_counted
                      if all(c["status"] in (KILLED, NOT_RUN_HERE) for c in r["cells"].values())]
    wall = time.monotonic() - start
    report.update(
        kill_rate={"cells": f"{len(killed)}/{len(counted)}", "mutants": f"{len(mutants_killed)}/{len(mutants_counted)}",
                   "value": len(killed) / len(counted) if counted else None},
        not_killed=[{"mutant": r["mutant"], "family": f, "status": c["status"]} for r, f, c in bad],
        not_judged_here=not_here,
        false_alarms=[{"mutant": r["mutant"], "family": f} for r, f, _ in false_alarms],
        seconds=round(wall, 1))
    print()
    print(kill_matrix_text(rows))
    print()
    print(f"kill rate: {len(killed)}/{len(counted)} cells, {len(mutants_killed)}/{len(mutants_counted)} mutants "
          f"(equivalent mutants excluded: {', '.join(r['mutant'] for r in rows if r['equivalent']) or 'none'})")
    for r, f, c in bad:
        print(f"NOT KILLED: {r['mutant']} on {f}: {c['status']}" +
              (" (a crash is not a kill)" if c["status"] == CRASHED else ""))
    for r in rows:
        for f, c in r["cells"].items():
            if c["status"] == NOT_RUN_HERE:
                print(f"NOT JUDGED HERE: {r['mutant']} on {f}: no case of {f} that can kill it runs on this machine")
    for r, f, _ in false_alarms:
        print(f"FALSE ALARM: equivalent mutant {r['mutant']} was killed on {f}: the suite rejects a correct variant")
    print(f"rank logs: {args.logs}")
    print(f"mutation check {'passed' if not bad and not false_alarms else 'FAILED'} in {wall:.1f} s")
    _write(args.json, report)
    return 1 if bad or false_alarms else 0


def _write(path, report) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
