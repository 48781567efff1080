"""Collective counts as an observable (parity/observe/collectives.py): the case-file key, the exact check, and
the counter itself on a one-process gloo group."""
import textwrap

import pytest

from parity.mutation import catalog as mutants
from parity.observe import collectives
from parity.matrix.cases import CaseFileError, load, load_file
from parity.checks.compare import Comparison
from parity.observe.observations import RankObservations
from parity.subjects import SUBJECTS
from tests.conftest import skip_or_fail

HEAD = """
[[matrix]]
subject = "row_parallel"
[matrix.axes]
dtype = ["fp32"]
"""


def write(tmp_path, text):
    path = tmp_path / "m.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_declaration_is_read_and_expanded(tmp_path):
    case = load_file(write(tmp_path, HEAD + "[matrix.collectives]\nall_reduce = 2\n'broadcast@4' = 1\n"
                                             "[matrix.collectives.first]\nall_gather_into_tensor = 1\n"))[0]
    declared = dict(case.collectives)
    assert collectives.expected_counts(declared, tp=2) == {"all_reduce@2": 2, "broadcast@4": 1}
    assert collectives.expected_counts(declared, tp=2, first=True) == {
        "all_reduce@2": 2, "broadcast@4": 1, "all_gather_into_tensor@2": 1}
    assert case.as_dict()["collectives"]["first"] == {"all_gather_into_tensor": 1}


@pytest.mark.parametrize("table,key,fragment,allowed", [
    ("all_reduse = 1", "matrix[0].collectives.all_reduse", "unknown collective", "all_reduce"),
    ("'all_reduce@x' = 1", "matrix[0].collectives.all_reduce@x", "unknown collective", "all_gather_into_tensor"),
    ("all_reduce = -1", "matrix[0].collectives.all_reduce", "bad count -1", "an integer >= 0"),
    ("all_reduce = 'two'", "matrix[0].collectives.all_reduce", "bad count 'two'", "an integer >= 0"),
])
def test_bad_declaration_names_file_key_and_allowed(tmp_path, table, key, fragment, allowed):
    path = write(tmp_path, HEAD + "[matrix.collectives]\n" + table + "\n")
    with pytest.raises(CaseFileError) as err:
        load_file(path)
    assert err.value.key == key and fragment in err.value.problem and str(path) in str(err.value)
    assert allowed in err.value.allowed


def _comparison(seen: dict, declared: dict):
    subject = SUBJECTS["row_parallel"]
    comp = Comparison.__new__(Comparison)
    comp.obs = {}
    for rank in (0, 1):
        o = RankObservations(rank, rank, 0)
        o.facts["collectives"] = {(0, 0): seen, (0, 1): seen}
        comp.obs[rank] = o
    comp.declared_collectives, comp.tp, comp.checks, comp.subject = declared, 2, [], subject
    return comp


@pytest.mark.parametrize("seen,passes", [
    ({"all_reduce@2": 2}, True),
    ({"all_reduce@2": 1}, False),  # a dropped all-reduce
    ({"all_reduce@2": 2, "broadcast@2": 1}, False),  # an extra collective
    ({"all_reduce@4": 2}, False),  # the right count on the wrong group (world instead of TP)
])
def test_counts_are_exact(seen, passes):
    comp = _comparison(seen, {"all_reduce": 2})
    comp.check_collectives(0, 1)
    assert [c.passed for c in comp.checks] == [passes, passes]
    assert all(c.name == "collectives" and c.rank is not None for c in comp.checks)


def test_not_observed_fails_and_undeclared_is_not_checked():
    comp = _comparison({}, {"all_reduce": 2})
    comp.obs[1].facts.pop("collectives")
    comp.check_collectives(0, 0)
    assert [c.passed for c in comp.checks] == [False, False]
    comp = _comparison({"all_reduce@2": 9}, {})
    comp.check_collectives(0, 0)
    assert comp.checks == []


def test_counter_counts_inside_the_window_only(tmp_path):
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        skip_or_fail("a process group already exists in this process (run this file alone)")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        collectives.install()
        t = torch.ones(3)
        dist.all_reduce(t)  # outside: not counted
        with collectives.recording() as counts:
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            with collectives.paused():
                dist.all_reduce(t)
        assert dict(counts) == {"all_reduce@1": 1, "broadcast@1": 1}
        # A collective issued on another thread inside the window counts: on CUDA, autograd runs a
        # backward (Megatron's all-reduce of the head input's gradient) on its own device thread.
        import threading

        with collectives.recording() as counts:
            worker = threading.Thread(target=dist.all_reduce, args=(t,))
            worker.start()
            worker.join()
        assert dict(counts) == {"all_reduce@1": 1}
        # DTensor's functional collectives are counted as the c10d kind they stand for, once each
        import torch.distributed._functional_collectives as funcol
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh("cpu", [0])
        with collectives.recording() as counts:
            funcol.all_reduce(t, "sum", group=(mesh, 0)).wait()
            funcol.all_gather_single(t, 0, group=mesh).wait()
        assert dict(counts) == {"all_reduce@1": 1, "all_gather_into_tensor@1": 1}
    finally:
        dist.destroy_process_group()


def test_every_subject_family_has_a_mutant_and_declared_counts():
    assert set(mutants.families()) == set(SUBJECTS) - {s for s in SUBJECTS if s.startswith("faulty")}
    for family in mutants.families():
        assert any(family in m.families for m in mutants.MUTANTS), family
    declared = {c.subject for c in load() if c.collectives}
    assert declared >= {"column_gathered", "vocab_parallel", "row_parallel", "tied_row_parallel",
                        "tied_vocab_parallel", "vocab_parallel_embedding", "ds_vocab_ce", "ds_fused_linear_ce",
                        "liger_vocab_ce", "torch_column_gathered", "torch_vocab_parallel", "torch_row_parallel",
                        "torch_vocab_embedding"}
    assert any("collectives" in m.observable for m in mutants.MUTANTS)  # a mutant only the counts catch
