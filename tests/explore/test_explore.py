"""`parity explore`: drawn points are the cases a case file would make; a documented divergence
explains a failure only when the evidence fits; a planted bug is found and shrunk to a small case,
and the same seed without it finds nothing.

The end-to-end runs are subprocesses: PARITY_MUTANT must not leak into this process or its rank groups."""
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from parity.checks.verdict import DIVERGED, FAILED
from parity.explore.domains import RANGES, entry_toml, explorable_subjects, explored_case, not_a_case, points
from parity.explore.known import Marks
from parity.explore.search import run_case
from parity.harness.rank_pool import PoolOutcome, RankError
from parity.harness.runner import Runner
from parity.matrix.cases import load_file

ROOT = Path(__file__).resolve().parents[2]
MARKS = Marks()
BUILT_IN = [s for s in explorable_subjects() if not s.startswith("faulty")]


def test_explorable_subjects_leave_out_only_the_refusals():
    assert "ds_reject" not in explorable_subjects()
    assert {"vocab_parallel", "torch_vocab_parallel", "ds_vocab_ce", "liger_vocab_ce"} <= set(BUILT_IN)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(points(BUILT_IN, 8))
def test_every_drawn_case_is_what_its_printed_entry_makes(tmp_path_factory, point):
    name, values = point
    if not_a_case(name, values, 8):
        return
    case = explored_case(name, values)
    assert case.world_size <= 8 and 2 <= values["tp"] <= RANGES["tp"][1]
    path = tmp_path_factory.mktemp("entry") / "one.toml"
    path.write_text(entry_toml(name, values, "round trip"))
    (again,) = load_file(path)
    assert (again.id, again.values, again.markers) == (case.id, case.values, case.markers)


def test_points_that_are_not_cases_say_why():
    base = {"backend": "torch", "dtype": "fp32", "reduction": "mean", "vocab": 2, "hidden": 32, "bias": True,
            "head": "lm_head", "ignore": "scattered", "zero": 0, "gas": 2, "tp": 3, "dp": 1, "grain": 1, "clip": 0.0,
            "device": "cpu", "ignore_index": -100, "triton": "device"}
    assert "empty vocabulary shard" in not_a_case("vocab_parallel", base, 8)
    assert not_a_case("vocab_parallel", {**base, "vocab": 3}, 8) is None
    # Only the vocabulary-parallel head refuses an empty shard: the gathered column head takes it and trains
    # (cases/deepspeed_heads.toml, vocab 3 over tp 4), so the search draws it.
    column = {k: v for k, v in base.items() if k not in ("backend", "triton")}
    assert not_a_case("column_gathered", column, 8) is None
    assert not_a_case("column_gathered", {**column, "vocab": 3, "tp": 4}, 8) is None
    assert "empty vocabulary shard" in not_a_case("vocab_parallel", {**base, "vocab": 3, "tp": 4}, 8)
    assert "--max-world 4" in not_a_case("vocab_parallel", {**base, "vocab": 30, "dp": 2}, 4)
    # ZeRO 2/3 refuse DP pre-scaling (cases/deepspeed_rejects.toml: zero2_prescale, zero2_predivide).
    assert "pre-scaling" in not_a_case("vocab_parallel", {**base, "vocab": 3, "zero": 2, "dp_reduce": "prescale"}, 8)
    assert not_a_case("vocab_parallel", {**base, "vocab": 3, "zero": 1, "dp_reduce": "predivide2"}, 8) is None
    assert not_a_case("vocab_parallel", {**base, "vocab": 3, "zero": 2, "dp_reduce": "comm_fp32"}, 8) is None
    # Without ZeRO, bf16 weights with float32 accumulation are refused (ds_reject zero0_bf16_fp32_accum).
    bf16 = {**base, "vocab": 3, "dtype": "bf16", "grad_accum": "fp32"}
    assert "float32 gradient accumulation" in not_a_case("vocab_parallel", bf16, 8)
    assert not_a_case("vocab_parallel", {**bf16, "zero": 1}, 8) is None
    # DTensor's chunk split may leave a rank empty: a documented divergence, so it is explored.
    torch_values = {k: base[k] for k in ("dtype", "reduction", "vocab", "hidden", "bias", "head", "ignore", "gas",
                                         "tp", "device")}
    assert not_a_case("torch_vocab_parallel", {**torch_values, "vocab": 5, "tp": 4}, 8) is None
    # Megatron refuses a vocabulary tp does not divide (cases/megatron.toml): found at vocab 151 over 3.
    megatron = {**{k: v for k, v in torch_values.items() if k != "head"}, "label_smoothing": 0.0}  # no head axis
    assert "uneven vocabulary" in not_a_case("megatron_vocab_parallel", {**megatron, "vocab": 151, "tp": 3}, 8)
    assert not_a_case("megatron_vocab_parallel", {**megatron, "vocab": 150, "tp": 3}, 8) is None
    # The uc_* subjects first train at save_tp: an empty vocabulary shard there is the saving engine's refusal for the
    # vocabulary-parallel head (explore met it at vocab 2, save_tp 4), while the column and row heads accept it and are
    # cases (ds_to_universal's crash, cases/deepspeed_universal.toml).
    uc = {"dtype": "fp32", "reduction": "mean", "vocab": 3, "hidden": 8, "bias": True, "zero": 1, "gas": 2,
          "save_tp": 4, "tp": 2, "dp": 2, "optimizer": "adamw", "device": "cpu"}
    assert "empty vocabulary shard at save_tp 4" in not_a_case("uc_vocab_parallel", {**uc, "head": "lm_head"}, 8)
    assert "empty vocabulary shard at save_tp 4" in not_a_case("uc_vocab_parallel", {**uc, "head": "output"}, 8)
    assert not_a_case("uc_vocab_parallel", {**uc, "vocab": 4, "head": "lm_head"}, 8) is None
    assert not_a_case("uc_column_gathered", uc, 8) is None
    assert not_a_case("uc_row_parallel", {**uc, "vocab": 2, "hidden": 2}, 8) is None


def test_a_twin_of_the_default_matrix_keeps_its_expectation():
    case = explored_case("torch_vocab_parallel", {"dtype": "fp32", "reduction": "mean", "vocab": 9, "hidden": 32,
                                                  "bias": True, "head": "lm_head", "ignore": "scattered", "gas": 2,
                                                  "tp": 4, "device": "cpu"})
    twin = MARKS.twin(case)
    assert twin is not None and twin.divergence is not None and twin.divergence.raises


class _Pool:
    """Stands in for a rank group: hands back the outcome it was given."""
    mode = "fake"

    def __init__(self, outcome):
        self.outcome = outcome

    def run(self, subject, values, timeout_s):
        return self.outcome

    def close(self, force=False):
        pass


def _crash(message: str) -> PoolOutcome:
    lost = {r: RankError(r, "RankLost", "lost to rank 3", "") for r in range(3)}
    return PoolOutcome(errors={**lost, 3: RankError(3, "RuntimeError", message, "")}, broken=True)


def _run_faked(outcome):
    # vocab 5 over 4 ranks is chunked 2,2,1,0: no case file has it, the empty-shard mark generalises to it.
    case = explored_case("torch_vocab_parallel", {"dtype": "fp32", "reduction": "mean", "vocab": 5, "hidden": 32,
                                                  "bias": True, "head": "lm_head", "ignore": "scattered", "gas": 2,
                                                  "tp": 4, "device": "cpu"})
    assert MARKS.twin(case) is None
    runner = Runner()
    runner.pools[(4, "cpu")] = _Pool(outcome)
    return run_case(runner, case, MARKS)


def test_a_mark_explains_a_failure_whose_evidence_it_names():
    verdict = _run_faked(_crash("index 0 is out of bounds for dimension 1 with size 0"))
    assert verdict.status == DIVERGED, verdict.reason
    assert "cases/torch_tp.toml:matrix[" in verdict.reason


def test_a_mark_does_not_explain_another_failure():
    verdict = _run_faked(_crash("something else went wrong"))
    assert verdict.status == FAILED, verdict.reason


def test_a_numerical_mark_does_not_carry_over_the_sizes_it_lists():
    # The Liger-gate mark lists vocab 18, grain 4, tp 3 (unequal shards 8/4/6); at vocab 2 the shards
    # are equal and a failure there is not that divergence, however the failed checks are named.
    values = {"backend": "liger", "dtype": "fp32", "reduction": "mean", "vocab": 2, "hidden": 2, "bias": True,
              "head": "model.lm_head", "ignore": "scattered", "zero": 1, "gas": 2, "tp": 2, "dp": 1, "grain": 5,
              "clip": 0.0, "device": "cpu", "ignore_index": -100, "triton": "claimed"}
    gate = [m for m in MARKS.marks if "liger_gate" in m.divergence.repro and m.subject == "vocab_parallel"]
    assert gate and not any(m.admits(explored_case("vocab_parallel", values)) for m in gate)
    at_its_sizes = {**values, "vocab": 18, "grain": 4, "tp": 3, "head": "lm_head", "zero": 0}
    assert any(m.admits(explored_case("vocab_parallel", at_its_sizes)) for m in gate)


def test_a_contract_mark_carries_over_sizes_and_nothing_else():
    # ZeRO 0's bf16 gradient dtype (contract[grad]) at vocab 2, hidden 2 (parity explore --seed 5):
    # the same divergence as at the listed sizes; an fp32 or ZeRO 1 case is not admitted.
    values = {"dtype": "bf16", "reduction": "mean", "vocab": 2, "hidden": 2, "bias": True, "head": "lm_head",
              "ignore": "scattered", "zero": 0, "gas": 1, "tp": 2, "dp": 1, "grain": 1, "clip": 0.0,
              "device": "cpu", "ignore_index": -100}
    dtype_marks = [m for m in MARKS.marks if m.subject == "column_gathered"
                   and m.divergence.checks == ("contract[grad]",)]
    assert any(m.admits(explored_case("column_gathered", values)) for m in dtype_marks)
    for other in ({"dtype": "fp32"}, {"zero": 1}):
        assert not any(m.admits(explored_case("column_gathered", {**values, **other})) for m in dtype_marks)


def test_an_any_size_mark_carries_over_sizes_and_nothing_else():
    # DeepSpeed's all-ignored loss of 0 (a mean over no target clamped to 1) holds at every vocabulary:
    # explore seeds 4-6 stopped on it at vocab 2 and 195 while the mark listed 35. Its case file says
    # any_size; a micro-batch that is not all ignored is still not admitted.
    values = {"dtype": "fp32", "reduction": "mean", "vocab": 195, "hidden": 7, "bias": True, "head": "lm_head",
              "ignore": "micro", "zero": 0, "gas": 3, "tp": 3, "dp": 1, "grain": 1, "clip": 0.0, "device": "cpu",
              "ignore_index": -100}
    all_ignored = [m for m in MARKS.marks if m.subject == "vocab_parallel" and m.divergence.any_size
                   and "all_ignored" in m.divergence.repro]
    assert any(m.admits(explored_case("vocab_parallel", values)) for m in all_ignored)
    assert not any(m.admits(explored_case("vocab_parallel", {**values, "ignore": "scattered"})) for m in all_ignored)


def test_a_case_under_two_marks_is_judged_against_both_together():
    # parity explore --seed 8: bf16, ZeRO 0, ignore_index 0 fails ZeRO 0's gradient dtype contract and
    # the swallowed ignore_index's numbers; each mark covers only its own checks, the two together all.
    from parity.matrix.cases import merged_divergence

    values = {"dtype": "bf16", "reduction": "mean", "vocab": 21, "hidden": 32, "bias": False, "head": "lm_head",
              "ignore": "none", "zero": 0, "gas": 1, "tp": 2, "dp": 1, "grain": 1, "clip": 0.0, "device": "cpu",
              "ignore_index": 0}
    marks = MARKS.candidates(explored_case("vocab_parallel", values))
    assert len(marks) >= 2 and not any(m.divergence.covers("contract[grad]") and m.divergence.covers("loss")
                                       for m in marks)
    together = merged_divergence([m.divergence for m in marks])
    assert together.covers("contract[grad]") and together.covers("loss") and together.covers("master_weight[x]")
    assert not together.covers("sgd_update[lm_head.weight]")


def test_a_mark_that_binds_its_mechanisms_axes_frees_the_others():
    # AutoTP's spec'd embedding drops padding_idx whatever the ZeRO stage: explore seeds 1, 13 and 14 (H200
    # host's CPUs) stopped at padding first under ZeRO 2, unclipped, which the marks' tables (ZeRO 0/1, or
    # clipped) did not list. The marks bind padding; padding "none" is still not admitted, nor, for the
    # clipping norm's mark (binds clip), an unclipped case.
    values = {"dtype": "fp32", "reduction": "mean", "vocab": 2, "hidden": 2, "bias": True, "head": "lm_head",
              "ignore": "scattered", "zero": 2, "gas": 1, "tp": 2, "dp": 1, "grain": 1, "clip": 0.0, "device": "cpu",
              "padding": "first", "embed_spec": "row"}
    case = explored_case("embed_spec_untied", values)
    padding = [m for m in MARKS.marks if "padding_idx" in m.divergence.repro and m.subject == "embed_spec_untied"]
    assert padding and all(m.divergence.binds == ("padding",) for m in padding)
    assert any(m.admits(case) for m in padding)
    assert not any(m.admits(explored_case("embed_spec_untied", {**values, "padding": "none"})) for m in padding)
    norm = [m for m in MARKS.marks if "clip_norm" in m.divergence.repro and m.subject == "embed_spec_untied"]
    assert norm and not any(m.admits(case) for m in norm)
    assert any(m.admits(explored_case("embed_spec_untied", {**values, "clip": 1.0})) for m in norm)
    assert not any(m.admits(explored_case("embed_spec_untied", {**values, "clip": 1.0, "dtype": "bf16", "zero": 1}))
                   for m in norm)


def test_the_flat_layout_mark_reaches_uneven_vocabularies_only():
    # parity explore --seed 1 stopped twice on the TP replicas of proj.weight drifting apart under bf16 masters at
    # tp 2 x dp 2 (column_gathered vocab 3, hidden 6, ZeRO 1; vocab_parallel vocab 55, hidden 55, ZeRO 2, grain 16,
    # ignore_index 0): the flat-layout mark carries over sizes, but not to an even vocabulary (equal layouts: the
    # replicas must agree), nor to fp32 masters at dp 2 (a commutative sum), nor to ZeRO 0 or 3 (no flat partition).
    values = {"dtype": "bf16", "reduction": "mean", "vocab": 7, "hidden": 20, "bias": True, "head": "lm_head",
              "ignore": "scattered", "zero": 1, "gas": 3, "tp": 2, "dp": 2, "grain": 1, "clip": 0.0, "device": "cpu",
              "bf16_master": True}
    layout = [m for m in MARKS.marks if m.divergence.repro.endswith("tp_replica_flat_layout.py")]
    assert layout and all(m.divergence.uneven_vocab for m in layout)

    def admitted(subject, **changed):
        return any(m.admits(explored_case(subject, {**values, **changed})) for m in layout)

    assert admitted("column_gathered") and admitted("column_gathered", vocab=101, hidden=3)
    assert admitted("vocab_parallel", vocab=55, hidden=55, zero=2, grain=16, ignore_index=0, ignore="none")
    assert not admitted("column_gathered", vocab=8) and not admitted("vocab_parallel", vocab=54, zero=2)
    # in grains of 16, 48 rows split 32/16 (uneven) and 64 rows 32/32
    assert admitted("column_gathered", vocab=48, grain=16) and not admitted("column_gathered", vocab=64, grain=16)
    assert not admitted("column_gathered", bf16_master=False) and not admitted("column_gathered", zero=3)
    # rare at dp 1 (flat lengths straddling a multiple of 32): carried to the one such layout a case holds, no other
    assert not admitted("column_gathered", dp=1) and admitted("column_gathered", dp=1, vocab=3, hidden=10, gas=2)
    assert not admitted("column_gathered", dp=1, vocab=3, hidden=11)
    # the summed gradient's order at dp 3: fp32 masters, any uneven vocabulary; an even one is still held
    assert admitted("vocab_parallel", dtype="fp32", bf16_master=False, dp=3, vocab=9, tp=2)
    assert not admitted("vocab_parallel", dtype="fp32", bf16_master=False, dp=3, vocab=10, tp=2)


@pytest.mark.parametrize("line, error", [('binds = ["paddding"]', "binds.*paddding"),  # an axis the subject lacks
                                         ('any_size = "yes"', "any_size"), ('uneven_vocab = 1', "uneven_vocab")])
def test_a_bad_mark_key_is_a_one_line_error_naming_it(tmp_path, line, error):
    from parity.matrix.cases import CaseFileError, load_file

    path = tmp_path / "bad.toml"
    path.write_text('[[matrix]]\nsubject = "vocab_parallel"\n[matrix.known_divergence]\nreason = "r"\n'
                    f'repro = "ci/repro/liger_double_backward.py"\n{line}\n')
    with pytest.raises(CaseFileError, match=error):
        load_file(path)


def _explore(tmp_path, mutant: str | None):
    env = {k: v for k, v in os.environ.items() if k != "PARITY_MUTANT"}
    if mutant:
        env["PARITY_MUTANT"] = mutant
    report = tmp_path / ("mutant" if mutant else "clean")
    cmd = [sys.executable, "-m", "parity.cli", "explore", "--subject", "ds_vocab_ce", "--max-world", "2",
           "--max-examples", "4", "--seed", "3", "--budget", "240", "--report", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc, json.loads((report / "explore.json").read_text()), report


def test_explore_finds_and_shrinks_a_planted_bug_and_not_without_it(tmp_path):
    # DeepSpeed's CE with vocab_start + 1 on every rank: any case fails; the shrunk one must be minimal.
    proc, summary, report = _explore(tmp_path, "ce_vocab_start_off_by_one")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    failure = summary["failure"]
    assert failure is not None and failure["axes"]["tp"] == 2 and failure["axes"]["vocab"] <= 4, failure
    # The printed entry is a case file that makes the failing case, and the command runs exactly it.
    entry = tomllib.loads((report / "explore-failure.toml").read_text())
    assert entry["matrix"][0]["subject"] == "ds_vocab_ce"
    assert f"--case {failure['id']}" in proc.stdout and "PARITY_MUTANT=ce_vocab_start_off_by_one" in proc.stdout
    assert summary["stopped_by"] == "failure"

    proc, summary, _ = _explore(tmp_path, None)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert summary["failure"] is None and summary["counts"].get("failed", 0) == 0
    assert summary["stopped_by"] == "max_examples" and sum(summary["counts"].values()) == 4


def _verdict_with(*checks):
    from parity.checks.verdict import Verdict
    from parity.matrix.cases import load

    case = load()[0]
    return Verdict(case, FAILED, checks=list(checks))


def test_only_rounding_bounds_missed_by_a_little_are_confirmed_over_seeds():
    from parity.checks.compare import Check
    from parity.explore.search import CONFIRM_REACH, rounding_misses_only

    rms = Check("grad[w]", False, measured=1.05, bound=1.0, detail="lucky-reference rms criterion")
    assert rounding_misses_only(_verdict_with(rms, Check("loss", True, measured=0.1, bound=1.0, detail="max criterion")))
    far = Check("grad[w]", False, measured=CONFIRM_REACH * 1.01, bound=1.0, detail="rms criterion")
    exact = Check("sgd_update[w]", False, measured=1e-9, bound=0.0, detail="max criterion")
    master = Check("master_weight[w]", False, measured=1.07, bound=1.0)  # no criterion named: a bound all the same
    assert rounding_misses_only(_verdict_with(master))
    contract = Check("contract[grad]", False, detail="dtype bfloat16, reference float32")
    for other in (far, exact, contract):
        assert not rounding_misses_only(_verdict_with(rms, other)), other
    # Under a mark that covers the contract (ZeRO 0's bf16 gradient dtype), the rounding miss left over is confirmed.
    from dataclasses import replace

    from parity.matrix.cases import KnownDivergence

    marked = _verdict_with(rms, contract)
    marked.case = replace(marked.case, divergence=KnownDivergence("r", "ci/repro/x.py", checks=("contract",)))
    assert rounding_misses_only(marked)
    from parity.explore.search import explains_some

    assert explains_some(marked.case.divergence, marked)
    crash = KnownDivergence("r", "ci/repro/x.py", raises="AssertionError: x")
    assert not explains_some(crash, marked)
    assert not explains_some(KnownDivergence("r", "ci/repro/x.py", checks=("loss",)), marked)


def test_a_miss_is_a_failure_where_most_other_seeds_fail_too(monkeypatch):
    from parity.checks.compare import Check
    from parity.checks.verdict import PASSED, Verdict
    from parity.explore import search

    miss = _verdict_with(Check("grad[w]", False, measured=1.05, bound=1.0, detail="rms criterion"))
    for failing, confirmed in (({1, 2, 3, 4, 5}, True), ({1, 2, 3, 4}, False), (set(), False)):
        seen = []
        monkeypatch.setattr(search, "run_case", lambda runner, case, marks: Verdict(
            case, FAILED if case.values["seed"] in failing else PASSED))
        out = search.confirm(None, miss.case, miss, MARKS, seen.append)
        assert [v.case.values["seed"] for v in seen] == list(range(1, 1 + search.CONFIRM_SEEDS))
        assert (out is None) == confirmed, (failing, out)
        if out is not None:
            assert out.failed_seeds == sorted(failing) and "other seeds" in out.describe()


def test_unconfirmed_misses_are_written_as_entries_their_commands_run(tmp_path):
    from parity.checks.compare import Check
    from parity.explore.search import Exploration, Unconfirmed, write_unconfirmed

    miss = _verdict_with(Check("grad[w]", False, measured=1.05, bound=1.0, detail="rms criterion"))
    result = Exploration(0, 1.0, 4, [miss.case.subject], unconfirmed=[Unconfirmed(miss, [], list(range(1, 9)))])
    path = write_unconfirmed(result, tmp_path)
    assert [c.id for c in load_file(path)] == [miss.case.id]
    assert f"--matrix {path}" in result.unconfirmed[0].describe() and "--seeds 9" in result.unconfirmed[0].describe()
