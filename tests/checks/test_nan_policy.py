"""Where unsharded torch gives nan (its 0/0 for a mean over all-ignored targets), a subject must give
nan at exactly those places: a number there fails, and so does a nan anywhere else."""
from types import SimpleNamespace

import numpy as np

from parity.checks.compare import Comparison
from parity.subjects.base import Claims


def judge(got, oracle, kind="close"):
    c = object.__new__(Comparison)  # only the dtypes, the claims and the check list are needed
    c.dtype, c.stage_dtype, c.checks, c.claims = "fp32", "fp32", [], Claims({}, {})
    c.reference = SimpleNamespace(floor_dtypes={})
    if kind == "close":
        c.close("loss", np.array(got), np.array(oracle), np.array(oracle), kind="loss")
    else:
        c.exact("loss", np.array(got), np.array(oracle))
    return c.checks[0]


def test_nan_where_torch_gives_nan_passes():
    assert judge([np.nan, 1.0], [np.nan, 1.0]).passed
    assert judge([np.nan, 1.0], [np.nan, 1.0], "exact").passed


def test_a_number_where_torch_gives_nan_fails():
    check = judge([0.0, 1.0], [np.nan, 1.0])
    assert not check.passed and "a number where it gives nan (1)" in check.detail
    assert not judge([0.0, 1.0], [np.nan, 1.0], "exact").passed


def test_nan_where_torch_gives_a_number_fails():
    check = judge([np.nan, 1.0], [2.0, 1.0])
    assert not check.passed and "nan where unsharded torch gives a number (1)" in check.detail
    assert not judge([np.nan, 1.0], [2.0, 1.0], "exact").passed


def test_the_finite_rest_is_still_held_to_its_bound():
    assert not judge([np.nan, 1.5], [np.nan, 1.0]).passed


def test_the_same_infinity_where_torch_has_one_passes_and_drops_out_of_the_bound():
    check = judge([-np.inf, 1.0], [-np.inf, 1.0])
    assert check.passed and "1 infinite as in torch" in check.detail
    assert not judge([-np.inf, 1.5], [-np.inf, 1.0]).passed


def test_a_number_or_another_infinity_where_torch_has_one_fails():
    assert not judge([0.0, 1.0], [-np.inf, 1.0]).passed
    assert not judge([np.inf, 1.0], [-np.inf, 1.0]).passed
    assert "infinite where unsharded torch gives a number (1)" in judge([np.inf, 1.0], [2.0, 1.0]).detail
