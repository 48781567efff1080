"""Structure before numbers (issue 45 item 1): what each rank built before its first forward is held to the
claims and the partition formula as named structure[...] checks, run before any number is compared."""
import torch

from parity.checks.compare import Comparison
from parity.observe.observations import RankObservations
from parity.observe.partition import shard_slice
from parity.subjects import SUBJECTS
from parity.subjects.base import Claims
from parity.subjects.values import resolve
from references.trajectory import Trajectory

TP, VOCAB, HIDDEN = 2, 35, 32
CLAIMS = Claims(module_types={"lm_head": "VocabParallelLinear"},
                param_shards={"lm_head.weight": 0, "lm_head.bias": 0, "proj.weight": None},
                micro_records={"logits": -1, "loss": None})
FULL = {"lm_head.weight": (VOCAB, HIDDEN), "lm_head.bias": (VOCAB,), "proj.weight": (HIDDEN, HIDDEN)}


def built(tp_rank):
    """A rank's structure as the formula says: its vocabulary rows of the head, proj whole."""
    part = shard_slice(VOCAB, TP, tp_rank)
    rows = part.stop - part.start
    return {"params": {"lm_head.weight": {"shape": (rows, HIDDEN)}, "lm_head.bias": {"shape": (rows,)},
                       "proj.weight": {"shape": (HIDDEN, HIDDEN)}},
            "modules": {"lm_head": {"class": "VocabParallelLinear", "gather_output": False, "tp_world_size": TP,
                                    "tp_index": tp_rank, "vocab_start_index": part.start,
                                    "vocab_end_index": part.stop}}}


def judge(structures):
    c = object.__new__(Comparison)  # only what check_structure reads
    c.tp, c.grain, c.split, c.claims, c.checks = TP, 1, "near_even", CLAIMS, []
    c.values = resolve(SUBJECTS["vocab_parallel"], {"vocab": VOCAB, "tp": TP})
    c.reference = Trajectory(records={("weight", -1, None, None, n): torch.zeros(s) for n, s in FULL.items()})
    c.obs = {}
    for r, structure in structures.items():
        o = RankObservations(r, r % TP, r // TP)
        if structure is not None:
            o.facts["structure"] = structure
        c.obs[r] = o
    c.check_structure()
    return c.checks


def failed(checks):
    return {(ch.name, ch.rank): ch.detail for ch in checks if not ch.passed}


def test_the_formulas_structure_passes():
    checks = judge({r: built(r) for r in range(TP)})
    assert failed(checks) == {}
    names = {ch.name for ch in checks}
    assert {"structure[lm_head.weight]", "structure[proj.weight]", "structure[lm_head.vocab_range]",
            "structure[lm_head.tp_index]", "structure[lm_head.gather_output]"} <= names


def test_a_replicated_head_fails_by_name():
    structures = {r: built(r) for r in range(TP)}
    for s in structures.values():
        s["params"]["lm_head.weight"] = {"shape": (VOCAB, HIDDEN)}
    found = failed(judge(structures))
    assert set(found) == {("structure[lm_head.weight]", 0), ("structure[lm_head.weight]", 1)}
    assert "found replicated (35, 32)" in found[("structure[lm_head.weight]", 0)]


def test_a_misplaced_slice_fails_by_name():
    structures = {0: built(0), 1: built(1)}  # 18/17 by the formula; built 17/18, the range moved with it
    structures[0]["params"]["lm_head.weight"] = {"shape": (17, HIDDEN)}
    structures[1]["params"]["lm_head.weight"] = {"shape": (18, HIDDEN)}
    structures[0]["modules"]["lm_head"]["vocab_end_index"] = 17
    found = failed(judge(structures))
    assert set(found) == {("structure[lm_head.weight]", 0), ("structure[lm_head.weight]", 1),
                          ("structure[lm_head.vocab_range]", 0)}
    assert "built (17, 32) = [0, 17) of 35" in found[("structure[lm_head.weight]", 0)]
    assert "expected (18, 32): [0, 18)" in found[("structure[lm_head.weight]", 0)]


def test_a_gathered_head_where_the_claims_shard_the_logits_fails():
    structures = {r: built(r) for r in range(TP)}
    structures[1]["modules"]["lm_head"]["gather_output"] = True
    assert set(failed(judge(structures))) == {("structure[lm_head.gather_output]", 1)}


def test_a_rank_that_recorded_no_structure_fails():
    assert set(failed(judge({0: built(0), 1: None}))) == {("structure", 1)}


def judge_subject(subject, values, full, structures):
    """check_structure with a subject's own claims at ``values`` (its grain and split) over ``full`` shapes."""
    c = object.__new__(Comparison)
    c.values = resolve(SUBJECTS[subject], values)
    c.claims = SUBJECTS[subject].claims(c.values)
    c.tp, c.grain, c.split, c.checks = c.values["tp"], c.values.optional("grain", 1), c.claims.split, []
    c.reference = Trajectory(records={("weight", -1, None, None, n): torch.zeros(s) for n, s in full.items()})
    c.obs = {}
    for r, structure in structures.items():
        o = RankObservations(r, r % c.tp, r // c.tp)
        o.facts["structure"] = structure
        c.obs[r] = o
    c.check_structure()
    return c.checks


INFERENCE_FULL = {"lm_head.weight": (34, 32), "lm_head.bias": (34,)}


def inference_built(columns, tp_rank, tp=2):
    """What init_inference builds: LmHeadLinearAllreduce with ``columns`` of the hidden dim, the bias whole."""
    return {"params": {"lm_head.weight": {"shape": (34, columns)}, "lm_head.bias": {"shape": (34,)}},
            "modules": {"lm_head": {"class": "LmHeadLinearAllreduce", "tp_world_size": tp, "tp_index": tp_rank}}}


def test_the_inference_heads_hidden_slice_passes_and_a_cached_groups_quarter_fails():
    values = {"vocab": 34, "hidden": 32, "tp": 2}
    ok = judge_subject("inference_head", values, INFERENCE_FULL, {r: inference_built(16, r) for r in range(2)})
    assert failed(ok) == {}
    assert {"structure[lm_head.weight]", "structure[lm_head.bias]", "structure[lm_head.tp_index]"} <= {
        ch.name for ch in ok}
    # A second engine that took an earlier tp-4 engine's group: a quarter of the hidden dim, index r of 4.
    found = failed(judge_subject("inference_head", values, INFERENCE_FULL,
                                 {r: inference_built(8, r, tp=4) for r in range(2)}))
    assert set(found) == {(f"structure[lm_head.{c}]", r) for c in ("weight", "tp_index") for r in range(2)}
    assert "expected (34, 16): [0, 16) of 32 along dim 1" in found[("structure[lm_head.weight]", 0)]


def test_a_resumed_vocab_parallel_head_is_held_to_the_resumed_layout():
    values = {"vocab": 35, "hidden": 8, "tp": 2, "save_tp": 2, "dp": 1}
    full = {"lm_head.weight": (35, 8), "lm_head.bias": (35,), "proj.weight": (8, 8)}

    def resumed(rows, r):
        return {"params": {"lm_head.weight": {"shape": (rows, 8)}, "lm_head.bias": {"shape": (rows,)},
                           "proj.weight": {"shape": (8, 8)}},
                "modules": {"lm_head": {"class": "VocabParallelLinear", "tp_world_size": 2, "tp_index": r}}}

    assert failed(judge_subject("uc_vocab_parallel", values, full, {0: resumed(18, 0), 1: resumed(17, 1)})) == {}
    found = failed(judge_subject("uc_vocab_parallel", values, full, {0: resumed(17, 0), 1: resumed(18, 1)}))
    assert {name for name, _ in found} == {"structure[lm_head.weight]", "structure[lm_head.bias]"}
