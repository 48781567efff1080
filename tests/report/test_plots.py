"""report.html draws its case figures on one reused figure (plots.CaseCanvas): each must be, pixel
for pixel, the figure a new canvas draws of that case, whatever case came before it."""
import pytest

from parity.report.plots import CaseCanvas, case_figure, missing
from tests.report import writer_golden

if missing():
    pytest.fail(missing())  # the test extra installs matplotlib: without it this file tests nothing


def test_a_reused_canvas_draws_each_case_as_a_new_one_does():
    drawn = [r for r in writer_golden.records() if case_figure(r)[0] is not None]
    assert len(drawn) >= 8
    alone = {r["id"]: case_figure(r) for r in drawn}
    # Both orders: an axis over the bound before one under it and the reverse, many tensors before few.
    for order in (drawn, drawn[::-1]):
        canvas = CaseCanvas()
        again = {r["id"]: case_figure(r, canvas) for r in order}
        assert [i for i in alone if again[i] != alone[i]] == []
