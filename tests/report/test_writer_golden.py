"""The report files of a fixed set of verdict dicts are, byte for byte, what the writer made of them
before it was made faster (tests/report/writer_golden.py; data/writer-golden/). The PNGs inside
report.html depend on the plotting libraries' versions, so they are compared apart, and only where
those versions are the ones the golden files were made with. Every way of writing is compared: all
in this process; results.jsonl and the figures in two forked workers while this process writes
the rest (parity.report.workers); and results.jsonl's lines made case by case as verdicts arrive
(parity.report.stream, as parity run --report does)."""
import gzip
import json
import re

import pytest

from tests.conftest import skip_or_fail
from tests.report import writer_golden

PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")


@pytest.fixture(scope="module", params=[0, 2, "streamed"], ids=["in_process", "2_workers", "streamed"])
def written(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("writer-golden")
    if request.param == "streamed":
        from parity.report.stream import ReportStream

        stream = ReportStream()
        for record in writer_golden.records():
            stream.add(record)
        _, texts = stream.parts()
        stream.close()
        writer_golden.write(directory, workers=2, results_texts=texts)
    else:
        writer_golden.write(directory, workers=request.param)
    return directory


def _golden(name: str) -> str:
    with gzip.open(writer_golden.GOLDEN / f"{name}.gz", "rt", encoding="utf-8", newline="") as f:
        return f.read()


def _first_difference(want: str, got: str) -> str:
    for number, (a, b) in enumerate(zip(want.splitlines(), got.splitlines()), start=1):
        if a != b:
            return f"line {number}:\n  golden: {a[:300]}\n  now:    {b[:300]}"
    return f"{len(want.splitlines())} lines in the golden file, {len(got.splitlines())} now"


@pytest.mark.parametrize("name", writer_golden.FILES)
def test_report_file_is_as_recorded(written, name):
    want, got = _golden(name), (written / name).read_text(encoding="utf-8")
    if name == "report.html":  # the images are compared below
        want, got = PNG.sub("data:image/png;base64,…", want), PNG.sub("data:image/png;base64,…", got)
    assert got == want, f"{name} differs from tests/report/data/writer-golden: {_first_difference(want, got)}"


def test_report_images_are_as_recorded(written):
    recorded = json.loads((writer_golden.GOLDEN / "versions.json").read_text())
    here = writer_golden.plotting_versions()
    if here != recorded:
        skip_or_fail(f"the golden images were drawn with {recorded}, this environment has {here} "
                     "(requirements-cpu.txt pins the recorded ones)")
    want, got = PNG.findall(_golden("report.html")), PNG.findall((written / "report.html").read_text())
    assert len(want) == 8 and len(got) == len(want)
    differing = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    assert not differing, f"images {differing} of report.html differ from the golden file's"
