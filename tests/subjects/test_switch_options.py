"""tensor_parallel.tp_overlap_comm and the bf16 section's switches (issue 13): what each case hands DeepSpeed, what it
must make DeepSpeed decide (the rank_decisions a passing case has matched), and, with real ranks, that the
process-global overlap switch of one case does not reach the next case of the same pooled rank group.
"""
from importlib.util import find_spec

import pytest

from parity.matrix.cases import CASES_DIR, load, load_file
from parity.subjects import SUBJECTS
from parity.subjects.deepspeed_autotp import CLEAN_STATE
from tests.conftest import skip_or_fail

HEADS = load_file(CASES_DIR / "deepspeed_heads.toml")
TRAIN = type("Train", (), {"batch": 2, "micro_batches": 2, "clip": 0.0})
DEFAULT_ID = "column_gathered-fp32-mean-v35-h32-bias-lm_head-ign_scattered-zero0-gas2-tp2-cpu"
OVERLAP_ID = DEFAULT_ID + "-ovl"


def _values(subject, **axes):
    from parity.subjects.values import resolve

    common = {"dtype": "fp32", "zero": 0, "tp": 2, "vocab": 35, "backend": "torch"}
    return resolve(SUBJECTS[subject], {**{a: v for a, v in common.items() if a in SUBJECTS[subject].axes}, **axes})


@pytest.mark.parametrize("subject", ["column_gathered", "vocab_parallel"])
def test_overlap_sets_the_key_only_when_asked_and_must_be_decided_either_way(subject):
    on, off = _values(subject, overlap=True), _values(subject)
    assert SUBJECTS[subject].ds_config(on, TRAIN)["tensor_parallel"]["tp_overlap_comm"] is True
    # Off: the key is left out, as every case before the axis handed DeepSpeed (its default, false).
    assert "tp_overlap_comm" not in SUBJECTS[subject].ds_config(off, TRAIN)["tensor_parallel"]
    # Every case of the two heads, default ones included, is held to the switch and to the autograd function
    # it selects: a true left over from an earlier case would fail the default case's rank_decisions.
    assert SUBJECTS[subject].decided(on) == {"tp_overlap_comm": True, "column_function": "AsyncColumnParallel",
                                             "torch_autocast": None, "gradient_clipping": 0.0}
    assert SUBJECTS[subject].decided(off) == {"tp_overlap_comm": False, "column_function": "ColumnParallel",
                                              "torch_autocast": None, "gradient_clipping": 0.0}
    assert SUBJECTS[subject].claims(on) == SUBJECTS[subject].claims(off)  # and the reference is the same


def test_bf16_switches_reach_the_config_and_the_decisions_only_when_set():
    subject = SUBJECTS["column_gathered"]
    bf16 = _values("column_gathered", dtype="bf16", zero=1, grad_accum="fp32")
    assert subject.ds_config(bf16, TRAIN)["bf16"] == {"enabled": True}
    igu = bf16.replace(immediate_grad=True)
    assert subject.ds_config(igu, TRAIN)["bf16"] == {"enabled": True, "immediate_grad_update": True}
    assert subject.decided(igu) == {"optimizer": "BF16_Optimizer", "immediate_grad_update": True,
                                    "grad_acc_hooks": True, "tp_overlap_comm": False,
                                    "column_function": "ColumnParallel", "torch_autocast": None,
                                    "gradient_clipping": 0.0}
    nochk = bf16.replace(grad_accum="model", overflow_check=False)
    assert subject.ds_config(nochk, TRAIN)["bf16"] == {"enabled": True, "check_grad_overflow": False}
    assert subject.decided(nochk)["check_grad_overflow"] is False and "optimizer" not in subject.decided(nochk)


def test_bf16_master_sets_both_keys_and_takes_the_reference_without_a_float32_master():
    subject = SUBJECTS["vocab_parallel"]
    on = _values("vocab_parallel", dtype="bf16", zero=1, bf16_master=True)
    off = _values("vocab_parallel", dtype="bf16", zero=1)
    # bf16_optimizer_states too: the masters alone are refused without ZeRO-Offload + DeepSpeedCPUAdam.
    assert subject.ds_config(on, TRAIN)["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True,
                                                     "bf16_optimizer_states": True}
    assert subject.decided(on)["master_dtype"] == "torch.bfloat16" and "master_dtype" not in subject.decided(off)
    assert subject.training_spec(on).master is False and subject.training_spec(off).master is True
    assert subject.reference_key(on) != subject.reference_key(off)
    assert not subject.records_master_weights(on) and subject.records_master_weights(off)


def test_clip_key_unset_leaves_the_key_out_and_must_find_the_default():
    unset, written = _values("column_gathered", clip_key="unset"), _values("column_gathered")
    assert "gradient_clipping" not in SUBJECTS["column_gathered"].ds_config(unset, TRAIN)
    assert SUBJECTS["column_gathered"].ds_config(written, TRAIN)["gradient_clipping"] == 0.0
    # What the engine must report on every rank: DeepSpeed's default where the key is left out, else the config's.
    assert SUBJECTS["column_gathered"].decided(unset)["gradient_clipping"] == 1.0
    assert SUBJECTS["column_gathered"].decided(written)["gradient_clipping"] == 0.0
    assert SUBJECTS["column_gathered"].invalid(_values("column_gathered", clip_key="unset", clip=1.0))


def test_each_switch_case_is_where_deepspeed_reads_the_switch():
    overlap = [c for c in HEADS if c.values.optional("overlap", None) and c["vocab"] == 35]
    # The rest are the gathered head's empty shard, a known crash of the async backward (overlap_comm_empty_head_shard).
    empty = [c for c in HEADS if c.values.optional("overlap", None) and c["vocab"] != 35]
    assert empty and all(c.subject == "column_gathered" and "cannot reshape" in c.divergence.raises for c in empty)
    assert {c.subject for c in overlap} == {"column_gathered", "vocab_parallel"}
    assert {(c["dtype"], c["zero"], c["tp"], c["bias"]) for c in overlap} == {
        (d, z, t, b) for d in ("fp32", "bf16") for z in (0, 2) for t in (2, 3) for b in (True, False)}
    # Parity expected; only ZeRO 0 bf16's documented grad dtype (not overlap's) may differ.
    for c in overlap:
        assert c.collectives and not c.expect.is_error
        assert c.divergence is None or (c["dtype"], c["zero"]) == ("bf16", 0)
    igu = [c for c in HEADS if c.values.optional("immediate_grad", None)]
    assert igu and all((c["dtype"], c["zero"], c["grad_accum"]) == ("bf16", 1, "fp32") for c in igu)  # BF16_Optimizer
    nochk = [c for c in HEADS if c.values.optional("overflow_check", None) is False]
    assert nochk and all(c["dtype"] == "bf16" and c["zero"] in (1, 2) and c["grad_accum"] == "model" for c in nochk)
    assert all(c.divergence is None for c in igu + nochk)
    master = [c for c in HEADS if c.values.optional("bf16_master", None) and c["grad_accum"] == "model"]
    assert {(c.subject, c["zero"]) for c in master} == {(s, z) for s in ("column_gathered", "vocab_parallel")
                                                         for z in (1, 2, 3)}
    # Only the dtype ZeRO 1/2's safe_get_full_grad hands back may differ: every number is held to plain torch's.
    for c in master:
        assert c["dtype"] == "bf16"
        assert (c.divergence is None) if c["zero"] == 3 else tuple(c.divergence.checks) == ("contract[grad]",)
    # With grad_accum fp32, ZeRO 1's BF16_Optimizer drops the switch (documented); ZeRO 2 honours it.
    dropped = {c["zero"]: c for c in HEADS if c.values.optional("bf16_master", None) and c["grad_accum"] == "fp32"}
    assert set(dropped) == {1, 2} and tuple(dropped[2].divergence.checks) == ("contract[grad]",)
    assert {"rank_decisions", "sgd_update"} <= set(dropped[1].divergence.checks)


def test_explore_draws_each_bf16_switch_only_where_deepspeed_reads_it():
    from parity.explore.domains import bf16_switch_off_its_reader
    from parity.subjects import SUBJECTS
    from parity.subjects.values import resolve

    def off(values):  # column_gathered declares every switch
        return bf16_switch_off_its_reader(resolve(SUBJECTS["column_gathered"], values))

    bf16_optimizer = {"dtype": "bf16", "zero": 1, "grad_accum": "fp32"}
    assert off({**bf16_optimizer, "immediate_grad": True}) is None
    assert off({"dtype": "bf16", "zero": 2, "immediate_grad": True})
    assert off({"dtype": "bf16", "zero": 2, "overflow_check": False}) is None
    assert off({**bf16_optimizer, "overflow_check": False}) and off({"dtype": "fp16", "zero": 1, "overflow_check": False})
    assert off({"dtype": "bf16", "zero": 3, "bf16_master": True}) is None
    assert off({"dtype": "bf16", "zero": 0, "bf16_master": True}) and off({**bf16_optimizer, "bf16_master": True})
    assert off({"dtype": "fp32", "zero": 0, "overlap": True}) is None  # overlap is drawn everywhere


def test_an_overlap_case_leaves_the_next_case_in_the_same_ranks_at_its_default():
    """Real ranks (about 30 s): the overlap case, then the default case in the same pooled rank group. The second
    must start clean (process_state_reset), run ColumnParallel with the attribute false (rank_decisions), and pass."""
    if find_spec("deepspeed") is None:
        skip_or_fail("deepspeed is not installed (requirements-cpu.txt pins it)")
    from parity.checks.verdict import PASSED
    from parity.harness.runner import Runner

    cases = {c.id: c for c in load() if c.id in (OVERLAP_ID, DEFAULT_ID)}
    runner = Runner(timeout_s=120)
    try:
        first, second = runner.run(cases[OVERLAP_ID]), runner.run(cases[DEFAULT_ID])
    finally:
        runner.close()
    for verdict in (first, second):
        assert verdict.status == PASSED, verdict.explain()
        named = {c.name for c in verdict.checks if c.passed}
        assert {"process_state_reset", "rank_decisions"} <= named
        assert not [c for c in verdict.checks if c.name in ("process_state_reset", "rank_decisions") and not c.passed]
    assert CLEAN_STATE["tp_overlap_comm"] is False


def _comparison(subject, values, tp=2):
    from parity.checks.compare import Comparison

    c = object.__new__(Comparison)  # only what the checks below read
    c.tp, c.grain, c.split, c.values, c.checks = tp, 1, "near_even", values, []
    c.subject, c.obs = SUBJECTS[subject], {}
    return c


def test_a_rank_that_ran_the_other_column_function_fails_its_decisions():
    from parity.observe.observations import RankObservations
    from parity.observe.partition import mesh_groups

    values = _values("column_gathered", overlap=True)
    for recorded, fails in ((("AsyncColumnParallel", True), False), (("ColumnParallel", True), True),
                            (("AsyncColumnParallel", False), True)):
        c = _comparison("column_gathered", values)
        for r in range(2):
            o = RankObservations(r, r, 0)
            o.facts["rank_decisions"] = {**mesh_groups(r, 2, 2), "engine_dp_world": 1, "gradient_clipping": 0.0,
                                         "column_function": recorded[0], "tp_overlap_comm": recorded[1]}
            c.obs[r] = o
        c.check_rank_decisions()
        assert any(not ch.passed for ch in c.checks if ch.name == "rank_decisions") is fails, recorded


def test_without_a_master_the_sgd_update_is_exact_in_bf16():
    import numpy as np
    import torch

    from references.trajectory import TrainingSpec

    c = _comparison("column_gathered", _values("column_gathered", dtype="bf16", zero=1, bf16_master=True))
    c.dtype, c.train = "bf16", TrainingSpec(master=False)
    prev = torch.tensor([1.0, 0.5, -0.25], dtype=torch.bfloat16)
    grad = torch.tensor([0.001, 0.03, -0.2], dtype=torch.bfloat16)
    bf16_step = prev.add(grad, alpha=-0.05).double().numpy()
    # What a float32 master holds after the same step (1.0 - 5e-5 is no bf16 value): the exact identity tells it apart.
    master_step = (prev.float() - 0.05 * grad.float()).double().numpy()
    c.check_sgd_identity("w", prev.double().numpy(), grad.double().numpy(), bf16_step, 0.05, 0, 0)
    c.check_sgd_identity("w", prev.double().numpy(), grad.double().numpy(), master_step, 0.05, 0, 0)
    assert [ch.passed for ch in c.checks] == [True, False] and not np.array_equal(bf16_step, master_step)
