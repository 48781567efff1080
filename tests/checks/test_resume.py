"""resumed[...] / resumed_global_steps (parity/checks/resume.py, the uc_* subjects): every resumed rank's tensors must
be bitwise the saving ranks' shards concatenated and re-sliced for the resumed layout. The ways a universal restore
goes wrong must each fail: TP rank 0's slice on every rank, the moments lost, the shards swapped at save, a missing
saving rank, the wrong step count; an empty shard's missing optimizer state (nothing to restore) alone passes."""
import numpy as np

from parity.checks.compare import Comparison, reference_pair
from parity.checks.resume import resume_checks
from parity.explore.domains import explored_case
from parity.matrix.cases import load
from parity.observe.observations import RankObservations
from parity.observe.partition import shard_slice
from parity.subjects import SUBJECTS
from parity.subjects.deepspeed_universal import SAVED_AFTER

# Saved at tp 2 (rows 18/17), resumed at tp 2: the same ranks save and resume.
CASE_ID = "uc_vocab_parallel-fp32-mean-v35-h8-bias-zero1-gas2-from_tp2-tp2-adamw-cpu-lm_head"
STATES = ("weight", "fp32", "exp_avg", "exp_avg_sq")
_PAIR = {}


def judged(edit_saved=None, edit_resumed=None, steps=SAVED_AFTER) -> dict:
    """check name -> passed: each state of each parameter is a distinct made-up whole tensor, the saving ranks hold
    its tp-2 shards, the resuming ranks (here the same layout) what edit_resumed leaves of the right slices."""
    case = next(c for c in load() if c.id == CASE_ID)
    subject = SUBJECTS[case.subject]
    if not _PAIR:
        _PAIR["pair"] = reference_pair(subject, case.values)
    reference, oracle = _PAIR["pair"]
    obs = {r: RankObservations(r, r, 0) for r in (0, 1)}
    cmp = Comparison(subject, case.values, obs, reference, oracle)
    names = [k[4] for k in reference.records if k[0] == "weight" and k[1] == -1]
    saved = {r: {} for r in (0, 1)}
    resumed = {r: {} for r in (0, 1)}
    for i, name in enumerate(names):
        shape = reference.get("weight", -1, None, None, name).shape
        for j, state in enumerate(STATES):
            whole = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1000 * (4 * i + j)
            for r in (0, 1):
                piece = cmp._param_view(name, whole, r)
                saved[r].setdefault(name, {})[state] = piece
                resumed[r].setdefault(name, {})[state] = piece.copy()
    if edit_saved is not None:
        edit_saved(saved)
    if edit_resumed is not None:
        edit_resumed(resumed)
    for r in (0, 1):
        if saved[r] is not None:
            obs[r].facts["checkpointed"] = {"tp_rank": r, "dp_rank": 0, "state": saved[r]}
        obs[r].facts["resumed"] = {"global_steps": steps, "optimizer_steps": [float(steps)], "state": resumed[r]}
    return {(c["name"], c["rank"]): c["passed"] for c in resume_checks(cmp)}


def failed(result: dict) -> set:
    return {key for key, ok in result.items() if not ok}


def test_the_saved_slices_pass_every_check():
    result = judged()
    assert result and not failed(result)
    assert {("resumed[lm_head.weight.exp_avg_sq]", 1), ("resumed[proj.weight.fp32]", 0),
            ("resumed_global_steps", 1)} <= set(result)


def test_rank_zeros_slice_on_rank_one_fails():
    def rank0(resumed):
        for state in STATES:
            resumed[1]["lm_head.weight"][state] = resumed[0]["lm_head.weight"][state][:17]
    assert failed(judged(edit_resumed=rank0)) == {(f"resumed[lm_head.weight.{s}]", 1) for s in STATES}


def test_zeroed_moments_fail():
    def zeroed(resumed):
        for r in (0, 1):
            resumed[r]["proj.weight"]["exp_avg"] = np.zeros_like(resumed[r]["proj.weight"]["exp_avg"])
    assert failed(judged(edit_resumed=zeroed)) == {("resumed[proj.weight.exp_avg]", 0),
                                                   ("resumed[proj.weight.exp_avg]", 1)}


def test_a_missing_state_a_swapped_save_and_the_wrong_step_count_fail():
    def missing(resumed):
        resumed[0]["lm_head.bias"].pop("exp_avg_sq")
    assert ("resumed[lm_head.bias.exp_avg_sq]", 0) in failed(judged(edit_resumed=missing))

    def swapped(saved):
        saved[0], saved[1] = saved[1], saved[0]
    assert ("resumed[lm_head.weight.fp32]", 0) in failed(judged(edit_saved=swapped))
    assert {("resumed_global_steps", 0), ("resumed_global_steps", 1), ("resumed_optimizer_step", 0),
            ("resumed_optimizer_step", 1)} <= failed(judged(steps=SAVED_AFTER - 1))


def judged_empty_row_shard(edit_resumed) -> dict:
    """The row head at hidden 2 saved at tp 2 and resumed at tp 4: ranks 2-3 hold a (vocab, 0) slice of lm_head.weight.
    Each rank's states are the saved ones' right slices; edit_resumed(resumed) then changes what the ranks report."""
    case = explored_case("uc_row_parallel", {"hidden": 2, "zero": 1, "save_tp": 2, "tp": 4, "dp": 1})
    subject = SUBJECTS[case.subject]
    reference, oracle = reference_pair(subject, case.values)
    ranks = range(4)
    obs = {r: RankObservations(r, r, 0) for r in ranks}
    cmp = Comparison(subject, case.values, obs, reference, oracle)
    names = [k[4] for k in reference.records if k[0] == "weight" and k[1] == -1]
    saved = {r: {} for r in ranks}
    resumed = {r: {} for r in ranks}
    for i, name in enumerate(names):
        shape = reference.get("weight", -1, None, None, name).shape
        dim = cmp.claims.param_shards.get(name)
        for j, state in enumerate(STATES):
            whole = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1000 * (4 * i + j)
            for r in ranks:
                saved_piece = whole
                if dim is not None:
                    index = [slice(None)] * whole.ndim
                    index[dim] = shard_slice(shape[dim], 2, r % 2, 1, cmp.split)
                    saved_piece = whole[tuple(index)]
                saved[r].setdefault(name, {})[state] = saved_piece
                resumed[r].setdefault(name, {})[state] = cmp._param_view(name, whole, r).copy()
    edit_resumed(resumed)
    for r in ranks:
        obs[r].facts["checkpointed"] = {"tp_rank": r % 2, "dp_rank": r // 2, "state": saved[r]}
        obs[r].facts["resumed"] = {"global_steps": SAVED_AFTER, "optimizer_steps": [float(SAVED_AFTER)],
                                   "state": resumed[r]}
    return {(c["name"], c["rank"]): c["passed"] for c in resume_checks(cmp)}


def test_no_optimizer_state_for_a_zero_element_shard_passes_and_nothing_else_does():
    def none_where_empty(resumed):  # what DeepSpeed reports: safe_get_full_* is None for the (vocab, 0) shards
        for r in (2, 3):
            assert resumed[r]["lm_head.weight"]["weight"].size == 0
            for state in STATES[1:]:
                resumed[r]["lm_head.weight"][state] = None
    result = judged_empty_row_shard(none_where_empty)
    assert ("resumed[lm_head.weight.exp_avg]", 3) in result and not failed(result)

    def weight_missing(resumed):  # the weight itself is never excused, empty or not
        none_where_empty(resumed)
        resumed[2]["lm_head.weight"]["weight"] = None
    assert failed(judged_empty_row_shard(weight_missing)) == {("resumed[lm_head.weight.weight]", 2)}

    def state_missing_on_a_full_shard(resumed):
        none_where_empty(resumed)
        resumed[1]["lm_head.weight"]["exp_avg"] = None
    assert failed(judged_empty_row_shard(state_missing_on_a_full_shard)) == {("resumed[lm_head.weight.exp_avg]", 1)}
