"""saved / saved_keys / saved_dtype / saved_weight (Comparison.check_saved, the save axis): global rank 0's saved
state dict must be the unsharded model's, every key whole and equal bitwise to the TP group's final shards
concatenated in rank order. The ways a save goes wrong that the brief names must each fail: a shard written for the
whole (DeepSpeed's save_16bit_model at ZeRO 0-2), shards in the wrong order, padding, a shard twice, a missing key,
the wrong dtype, nothing saved."""
import numpy as np

from parity.checks.compare import Comparison, reference_pair
from parity.matrix.cases import load
from parity.observe.observations import RankObservations
from parity.subjects import SUBJECTS

CASE_ID = "column_gathered-fp32-mean-v35-h35-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu-save_consolidated"
_PAIR = {}


def judged(edit=None, saved_none=False) -> dict:
    """check name -> passed, for a two-rank observation whose shards are the reference's final weights and whose
    rank 0 saved the whole weights, changed by ``edit(saved, shards)`` first."""
    case = next(c for c in load() if c.id == CASE_ID)
    subject = SUBJECTS[case.subject]
    if not _PAIR:
        _PAIR["pair"] = reference_pair(subject, case.values)
    reference, oracle = _PAIR["pair"]
    last = subject.training_spec(case.values).steps - 1
    obs = {r: RankObservations(r, r, 0) for r in (0, 1)}
    cmp = Comparison(subject, case.values, obs, reference, oracle)
    names = [k[4] for k in reference.records if k[0] == "weight" and k[1] == -1]
    shards = {}
    for name in names:
        whole = reference.get("weight", last, None, None, name)
        for r in (0, 1):
            shard = cmp._param_view(name, whole.numpy(), r)
            shards[(name, r)] = shard
            obs[r].tensors[("weight", last, None, name)] = shard
    saved = {name: (reference.get("weight", last, None, None, name).numpy().copy(), "float32") for name in names}
    if edit is not None:
        edit(saved, shards)
    obs[0].facts["saved"] = None if saved_none else saved
    cmp.check_saved()
    return {c.name: c.passed for c in cmp.checks}


def failed(result: dict) -> set:
    return {name for name, ok in result.items() if not ok}


def test_whole_weights_pass_every_check():
    result = judged()
    assert result and not failed(result)
    assert {"saved_keys", "saved[lm_head.weight]", "saved_dtype[lm_head.weight]", "saved_weight[lm_head.bias]"} <= set(result)


def test_rank_zeros_shard_fails():
    def shard(saved, shards):
        for key in ("lm_head.weight", "lm_head.bias"):
            saved[key] = (shards[(key, 0)], "float32")
    assert failed(judged(shard)) == {"saved[lm_head.weight]", "saved_weight[lm_head.weight]", "saved[lm_head.bias]",
                                     "saved_weight[lm_head.bias]"}


def test_wrong_order_padding_and_a_shard_twice_fail():
    key = "lm_head.weight"

    def reordered(saved, shards):
        saved[key] = (np.concatenate([shards[(key, 1)], shards[(key, 0)]]), "float32")

    def padded(saved, shards):
        saved[key] = (np.concatenate([shards[(key, 0)], np.zeros((1, shards[(key, 0)].shape[1])), shards[(key, 1)]]),
                      "float32")

    def twice(saved, shards):
        saved[key] = (np.concatenate([shards[(key, 0)], shards[(key, 0)]])[:saved[key][0].shape[0]], "float32")
    for edit in (reordered, padded, twice):
        assert "saved[lm_head.weight]" in failed(judged(edit)), edit.__name__


def test_a_missing_key_a_wrong_dtype_and_no_save_fail():
    assert failed(judged(lambda saved, shards: saved.pop("lm_head.bias"))) >= {"saved_keys", "saved[lm_head.bias]"}
    wrong_dtype = judged(lambda saved, shards: saved.update({"proj.weight": (saved["proj.weight"][0], "bfloat16")}))
    assert failed(wrong_dtype) == {"saved_dtype[proj.weight]"}
    assert failed(judged(saved_none=True)) == {"saved_keys"}
