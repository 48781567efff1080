"""A known divergence that is a crash (``raises``): diverged only on the named error, with every other
rank merely lost to it; any other error fails; a case that runs again is judged on its numbers."""
import textwrap

import pytest

from parity.checks.verdict import DIVERGED, FAILED
from parity.harness.rank_pool import PoolOutcome, RankError
from parity.harness.runner import judge
from parity.matrix.cases import CaseFileError, load_file

CASE = """
[[matrix]]
subject = "torch_vocab_parallel"
[matrix.axes]
vocab = [9]
tp = [4]
[matrix.known_divergence]
reason = "an empty shard crashes"
repro = "ci/repro/torch_empty_shard_mask_partial.py"
raises = {raises}
"""


def case(tmp_path, raises='"RuntimeError: index 0 is out of bounds"'):
    path = tmp_path / "m.toml"
    path.write_text(textwrap.dedent(CASE.format(raises=raises)))
    return load_file(path)[0]


def outcome(*errors):
    return PoolOutcome(errors={e.rank: e for e in errors}, broken=True)


CRASH = RankError(3, "RuntimeError", "index 0 is out of bounds for dimension 1 with size 0", "")
LOST = RankError(0, "RankLost", "still running 10 s after a peer failed (stuck in a collective?)", "")


def test_named_crash_with_lost_peers_is_diverged(tmp_path):
    verdict = judge(case(tmp_path), outcome(CRASH, LOST), strict=False)
    assert verdict.status == DIVERGED and "rank 3 raised RuntimeError" in verdict.reason


@pytest.mark.parametrize("errors", [
    (RankError(3, "RuntimeError", "something else entirely", ""), LOST),  # another crash
    (CRASH, RankError(1, "ValueError", "index 0 is out of bounds", "")),  # a second, unrelated error
])
def test_any_other_error_fails(tmp_path, errors):
    verdict = judge(case(tmp_path), outcome(*errors), strict=False)
    assert verdict.status == FAILED and "expected the known crash" in verdict.reason


def test_bad_raises_names_file_and_key(tmp_path):
    with pytest.raises(CaseFileError) as err:
        case(tmp_path, raises='"out of bounds"')
    assert err.value.key == "matrix[0].known_divergence.raises" and "ExceptionType: message" in err.value.allowed


def test_a_bare_assert_is_named_by_its_statement(tmp_path):
    """An assert without a message (DeepSpeed's ZeRO 3 defragment on an all-empty TP rank) reaches the verdict as the
    statement and its place, which a reader and a crash mark can tell apart from any other AssertionError."""
    from parity.harness.rank_worker import error_message

    # Compiled here, not in this module: pytest rewrites a test module's asserts to carry a message.
    source = tmp_path / "zero" / "utils.py"
    source.parent.mkdir()
    source.write_text("def defragment(tensors):\n    assert len(set(t for t in tensors)) == 1\n")
    namespace = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    try:
        namespace["defragment"]([])
    except AssertionError as exc:
        message = error_message(exc)
    assert message.endswith("assert len(set(t for t in tensors)) == 1 (" + f"{tmp_path.name}/zero/utils.py:2)"), message
    assert error_message(ValueError("kept as it was")) == "kept as it was"
