"""Per-rank decisions (issue 13 item 3): each rank's own view of its groups, data-parallel size and
head range is held to the suite's formula, and group members must agree with one another."""
import copy

from parity.checks.compare import Comparison
from parity.observe.observations import RankObservations
from parity.observe.partition import mesh_groups, shard_slice
from parity.subjects import SUBJECTS
from parity.subjects.values import resolve

TP, WORLD, VOCAB, GRAIN = 3, 6, 35, 1
VALUES = resolve(SUBJECTS["vocab_parallel"], {"vocab": VOCAB, "tp": TP, "dp": WORLD // TP, "grain": GRAIN})


def decisions(rank):
    """What an honest rank records: the mesh formulas, its head range, and what the configuration decides."""
    part = shard_slice(VOCAB, TP, rank % TP, GRAIN)
    return {**mesh_groups(rank, WORLD, TP), "engine_dp_world": WORLD // TP, "head_vocab_range": [part.start, part.stop],
            **SUBJECTS["vocab_parallel"].decided(VALUES)}


def judge(facts_by_rank):
    c = object.__new__(Comparison)  # only what check_rank_decisions reads
    c.tp, c.grain, c.split, c.values, c.checks = TP, GRAIN, "near_even", VALUES, []
    c.subject = SUBJECTS["vocab_parallel"]
    c.obs = {}
    for r, facts in facts_by_rank.items():
        o = RankObservations(r, r % TP, r // TP)
        if facts is not None:
            o.facts["rank_decisions"] = facts
        c.obs[r] = o
    c.check_rank_decisions()
    return {(ch.name, ch.rank) for ch in c.checks if not ch.passed}


def test_the_formula_passes():
    assert judge({r: decisions(r) for r in range(WORLD)}) == set()


def test_a_rank_in_the_wrong_tp_group_fails_and_its_peers_disagree():
    facts = {r: decisions(r) for r in range(WORLD)}
    facts[4] = {**facts[4], "tp_group": [1, 4]}  # strided instead of consecutive
    assert judge(facts) == {("rank_decisions", 4), ("rank_decisions_agree[tp_group]", None)}


def test_a_head_range_off_by_one_fails_on_that_rank():
    facts = {r: copy.deepcopy(decisions(r)) for r in range(WORLD)}
    facts[2]["head_vocab_range"][0] += 1
    assert judge(facts) == {("rank_decisions", 2)}


def test_a_wrong_data_parallel_size_and_a_missing_record_fail():
    facts = {r: decisions(r) for r in range(WORLD)}
    facts[0] = {**facts[0], "engine_dp_world": 1}
    facts[5] = None
    assert judge(facts) == {("rank_decisions", 0), ("rank_decisions", 5)}
