"""Case values are resolved once against the subject's declared axes: reading an undeclared one is an error, and
no subject restates a registry default through a dict-style .get."""
import ast
import pickle
from pathlib import Path

import pytest

from parity.axes import AXES
from parity.matrix.cases import load
from parity.subjects import SUBJECTS
from parity.subjects.base import NoModel
from parity.subjects.values import CaseValues, UndeclaredAxis, resolve, subject_axes

SUBJECTS_DIR = Path(__file__).resolve().parents[2] / "parity" / "subjects"


def axis_gets(source: str) -> list[str]:
    """Every `X.get(...)` whose first argument names an axis of the registry, and every `values.get(...)`."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and ((node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in AXES)
                 or (isinstance(node.func.value, ast.Name) and node.func.value.id == "values"))]


def test_no_subject_reads_an_axis_through_get():
    found = {p.name: axis_gets(p.read_text()) for p in sorted(SUBJECTS_DIR.glob("*.py"))}
    assert {name: calls for name, calls in found.items() if calls} == {}


def test_the_get_check_sees_one():
    assert axis_gets('def f(values):\n    return values.get("tp", 1)\n') == ["values.get('tp', 1)"]
    assert axis_gets("{k: values.get(k, v) for k, v in point.items()}") == ["values.get(k, v)"]
    assert axis_gets('os.environ.get("PATH")\n') == []


def cases_by_subject() -> dict:
    found = {}
    for case in load():
        found.setdefault(case.subject, []).append(case)
    return found


CASES = cases_by_subject()


@pytest.mark.parametrize("name", sorted(n for n, s in SUBJECTS.items() if type(s).__module__.startswith("parity.subjects.")))
def test_every_subject_reads_only_its_declared_axes(name):
    """What the parent asks of a subject, on every case of it: an undeclared axis read anywhere raises."""
    subject = SUBJECTS[name]
    assert CASES.get(name), f"subject {name!r} has no case"
    for case in CASES[name]:
        values = case.values
        assert subject.invalid(values) is None
        subject.world_size(values)
        subject.markers(values)
        subject.requires(values)
        subject.training_spec(values)
        subject.claims(values)
        subject.decided(values)
        subject.records_master_weights(values)
        subject.records_state_after_rejection(values)
        if not case.expect.is_error:  # a rejection case has no reference (parity/harness/job_processes.py)
            subject.reference_key(values)
        try:
            subject.model_spec(values)
        except UndeclaredAxis:
            raise
        except (NotImplementedError, KeyError):
            # No model in this case: a loss-only subject, or a ds_reject variant that drives a CE call.
            assert isinstance(subject, NoModel) or values.optional("variant", "none").startswith(("ce_", "fused_"))


def test_resolve_fills_declared_axes_and_refuses_others():
    subject = SUBJECTS["ds_vocab_ce"]
    values = resolve(subject, {"tp": 4})
    assert list(values) == list(subject_axes(subject))
    assert values["tp"] == 4 and values["reduction"] == "none"  # the subject's own default
    assert values["dtype"] == AXES["dtype"].default and values["seed"] == 0
    with pytest.raises(UndeclaredAxis, match="subject 'ds_vocab_ce' does not declare axis 'zero'"):
        resolve(subject, {"zero": 1})


def test_an_undeclared_axis_is_an_error_not_a_default():
    values = resolve(SUBJECTS["ds_vocab_ce"], {})
    with pytest.raises(UndeclaredAxis) as caught:
        values["zero"]
    assert isinstance(caught.value, KeyError)
    assert "'ds_vocab_ce'" in str(caught.value) and "'zero'" in str(caught.value)
    assert values.optional("zero", "absent") == "absent" and values.optional("tp", None) == values["tp"]
    with pytest.raises(TypeError, match="optional"):
        values.get("tp", 2)


def test_values_are_immutable_and_copied_by_replace():
    values = resolve(SUBJECTS["column_gathered"], {})
    changed = values.replace(zero=3, dtype="bf16")
    assert (changed["zero"], changed["dtype"], values["zero"]) == (3, "bf16", 0)
    assert list(changed) == list(values)
    with pytest.raises(UndeclaredAxis):
        values.replace(topk=2)
    with pytest.raises(TypeError):
        values["zero"] = 1
    with pytest.raises(AttributeError):
        values.x = 1
    assert {**values, "zero": 1}["zero"] == 1 and dict(values) == dict(values.items())
    assert pickle.loads(pickle.dumps(values)) == values and isinstance(pickle.loads(pickle.dumps(values)), CaseValues)


def test_widened_adds_axes_the_subject_does_not_vary():
    values = resolve(SUBJECTS["uc_column_gathered"], {})
    head = values.widened("head", "grain")
    assert (head["head"], head["grain"]) == (AXES["head"].default, AXES["grain"].default)
    assert values.widened(tied=True)["tied"] is True
    with pytest.raises(ValueError):
        values.widened(tp=2)


def test_a_case_hands_out_resolved_values():
    case = CASES["column_gathered"][0]
    assert isinstance(case.values, CaseValues) and case.values is case.values
    assert tuple(case.values.items()) == case.axes
