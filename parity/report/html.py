"""report.html: one self-contained page (styles and PNGs inline, no network) from verdict dicts."""
from __future__ import annotations

from collections import Counter
from html import escape

from parity.report.plots import case_figures, missing as plots_missing, ratio_by_kind_figure, ratio_histogram
from parity.report.records import (check_results, closest, counts_by_subject, failure_summary, first_divergence,
                                   fmt, is_near_failing, where, worst_check, worst_ratio)
from parity.checks.tolerances import NEAR_FAILING_RATIO
from parity.checks.verdict import DIVERGED, FAILED, SKIPPED, STATUSES, XPASSED

MAX_PLOTTED_CASES = 50  # failures first, then near-failing by ratio; the rest are listed, not plotted
MAX_FAILED_CHECKS = 20  # per case, in the order they ran

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1280px; margin: 1.5em auto;
       padding: 0 1em; color: #1f2328; line-height: 1.45; }
h1 { margin-bottom: .2em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 1.6em; }
h3 { margin-bottom: .3em; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 1em;
     word-break: break-all; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .88em; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: .5em .8em; overflow-x: auto;
      white-space: pre-wrap; word-break: break-all; }
table { border-collapse: collapse; margin: .5em 0; font-size: .9em; }
th, td { border: 1px solid #d0d7de; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.case { border: 1px solid #d0d7de; border-radius: 8px; padding: .2em 1em 1em; margin: 1.2em 0; }
.badge { display: inline-block; padding: 0 .5em; border-radius: 1em; font-size: .8em; font-weight: 600;
         color: #fff; font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; }
.failed { background: #cf222e; } .passed { background: #1a7f37; } .near { background: #bf8700; }
.skipped { background: #6e7781; } .diverged { background: #8250df; } .xpassed { background: #0969da; }
.headline { font-size: 1.15em; } .note { color: #57606a; font-size: .9em; }
img { max-width: 100%; border: 1px solid #eaeef2; }
"""

# Marks the page once every image has decoded: what a headless browser test reads back (--dump-dom).
IMAGE_PROBE = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var bad = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).length;
  document.body.setAttribute("data-images", bad ? "broken " + bad + " of " + imgs.length : "ok " + imgs.length);
});
"""


def _table(header, rows, numeric=()) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(
        f'<td class="num">{escape(str(c))}</td>' if i in numeric else f"<td>{c if isinstance(c, Markup) else escape(str(c))}</td>"
        for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


class Markup(str):
    """Already-escaped HTML for a table cell."""


def _badge(status: str, near: bool = False) -> str:
    return f'<span class="badge {"near" if near else escape(status)}">{"near-failing" if near else escape(status)}</span>'


def _anchor(index: int) -> str:
    return f"case-{index}"


def _check_row(c: dict) -> tuple:
    return (Markup(f'<span class="mono">{escape(c["name"])}</span>'), fmt(c.get("step"), "d"), fmt(c.get("micro"), "d"),
            fmt(c.get("rank"), "d"), fmt(c.get("measured")), fmt(c.get("bound")), fmt(c.get("margin")),
            fmt(c.get("ratio"), ".3g"), c.get("detail") or "")


CHECK_HEADER = ("tensor / check", "step", "micro", "rank", "measured", "bound", "margin", "ratio", "detail")


def _case_section(index: int, record: dict, figure: tuple) -> str:
    near = is_near_failing(record)
    parts = [f'<section class="case" id="{_anchor(index)}">',
             f"<h3>{escape(record['id'])} {_badge(record['verdict'], near)}</h3>",
             f"<p>worst measured/bound: <b>{escape(fmt(worst_ratio(record), '.3g'))}</b>"
             f" &middot; {escape(str(record.get('checks', 0)))} checks, {escape(str(record.get('failed_checks', 0)))} failed"
             f" &middot; {escape(str(record.get('seconds', '')))} s</p>"]
    first = first_divergence(record)
    if first is not None:
        parts += ["<h4>First divergence</h4>", _table(CHECK_HEADER, [_check_row(first)], numeric=range(1, 8))]
    elif record["verdict"] == FAILED:
        parts += ["<h4>First divergence</h4>", f"<pre>{escape(failure_summary(record))}</pre>"]
    else:
        worst = worst_check(record)
        if worst is not None:
            parts += ["<h4>Closest check to its bound</h4>", _table(CHECK_HEADER, [_check_row(worst)], numeric=range(1, 8))]
    errors = record.get("rank_errors") or {}
    if errors:
        parts.append(_table(("rank", "error"), [(r, f"{e['type']}: {e['message']}") for r, e in sorted(errors.items())]))
    parts += ["<h4>Reproduce</h4>", f"<pre><code>{escape(record['repro'])}</code></pre>"]
    png, left_out = figure
    if png:
        caption = ("max |subject - float64 oracle| over its bound, per step, one line per tensor (its worst rank at "
                   "each point); red line: the bound, orange: near-failing; red &times;: over the bound; zero errors "
                   "are not drawn on the log axis.")
        if left_out:
            caption += f" {left_out} more tensors not drawn (closest to their bound shown first)."
        parts.append(f'<figure><img alt="error vs bound per step: {escape(record["id"])}" '
                     f'src="data:image/png;base64,{png}"><figcaption class="note">{caption}</figcaption></figure>')
    else:
        parts.append(f'<p class="note">{escape(plots_missing() or "No per-step numerical checks to plot.")}</p>')
    failed_checks = [c for c in check_results(record) if not c["passed"]]
    if len(failed_checks) > 1:
        parts += [f"<h4>Failed checks ({len(failed_checks)}, first {min(len(failed_checks), MAX_FAILED_CHECKS)})</h4>",
                  _table(CHECK_HEADER, [_check_row(c) for c in failed_checks[:MAX_FAILED_CHECKS]], numeric=range(1, 8))]
    parts.append("</section>")
    return "\n".join(parts)


def _reasons(records, status) -> str:
    reasons = Counter(r.get("reason") or "" for r in records if r["verdict"] == status)
    return _table(("cases", "reason"), [(n, reason) for reason, n in reasons.most_common()], numeric=(0,))


def shown_cases(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(drawn, listed only): failures first, then near-failing cases, closest to their bound first."""
    shown = [r for r in records if r["verdict"] == FAILED]
    shown += sorted((r for r in records if is_near_failing(r)), key=lambda r: -worst_ratio(r))
    return shown[:MAX_PLOTTED_CASES], shown[MAX_PLOTTED_CASES:]


def figure_parts(records: list[dict], chunks: int = 1) -> list[tuple]:
    """What report.html draws, as report parts (parity.report.workers): (name, task, args) each;
    the case figures in up to `chunks` parts. gather_figures puts their results together."""
    plotted = shown_cases(records)[0]
    at = {id(r): i for i, r in enumerate(records)}
    positions = [at[id(r)] for r in plotted]
    bounds = [len(positions) * i // chunks for i in range(chunks + 1)]
    parts = [("cases", case_figures, (positions[a:b],)) for a, b in zip(bounds, bounds[1:]) if b > a]
    return parts + [("histogram", ratio_histogram, ()), ("by_kind", ratio_by_kind_figure, ())]


def gather_figures(done: list[tuple]) -> dict:
    """(name, result) of each of figure_parts' parts, in their order -> the figures report_html takes."""
    figures = {"cases": []}
    for name, result in done:
        if name == "cases":
            figures["cases"] += result
        else:
            figures[name] = result
    return figures


def report_html(records: list[dict], run: dict, figures: dict | None = None) -> str:
    """figures: gather_figures' answer, when the figures were drawn elsewhere; None: drawn here."""
    from parity.report.markdown import headline

    plotted, unplotted = shown_cases(records)
    shown = plotted + unplotted
    if figures is None:
        figures = gather_figures([(name, task(records, *args)) for name, task, args in figure_parts(records)])
    histogram, by_kind = figures["histogram"], figures["by_kind"]
    counts = run["counts"]
    toc = "".join(f'<li><a href="#{_anchor(i)}" class="mono">{escape(r["id"])}</a> '
                  f'{_badge(r["verdict"], is_near_failing(r))}</li>' for i, r in enumerate(plotted))
    body = ["<h1>parity run</h1>", f'<p class="headline"><b>{escape(headline(run))}</b></p>',
            f"<p>Command: <code>{escape(run['command'])}</code></p>",
            "<nav><h2>Contents</h2><ul>",
            '<li><a href="#summary">Summary</a></li>',
            f'<li><a href="#cases">Failing and near-failing cases</a> ({len(shown)})<ul>{toc}</ul></li>',
            '<li><a href="#margins">Tolerance margins</a></li>',
            '<li><a href="#other">Known divergences, skips, closest passing cases</a></li>',
            '<li><a href="#environment">Environment</a></li></ul></nav>',
            '<h2 id="summary">Summary</h2>',
            _table(("subject", "cases") + STATUSES, counts_by_subject(records), numeric=range(1, 2 + len(STATUSES))),
            '<h2 id="cases">Failing and near-failing cases</h2>',
            f'<p class="note">Near-failing: a passing case whose worst measured/bound ratio is at least '
            f'<b>{NEAR_FAILING_RATIO:g}</b> (<code>parity.checks.tolerances.NEAR_FAILING_RATIO</code>). Failures come first, '
            f"then near-failing cases, closest to their bound first; at most {MAX_PLOTTED_CASES} are drawn.</p>"]
    if not shown:
        body.append("<p>None: every case passed with its worst check below "
                    f"{NEAR_FAILING_RATIO:g} of its bound.</p>")
    body += [_case_section(i, r, figure) for i, (r, figure) in enumerate(zip(plotted, figures["cases"], strict=True))]
    if unplotted:
        body += [f"<h3>{len(unplotted)} more, not drawn</h3>",
                 _table(("case", "verdict", "ratio", "first divergence", "reproduce"),
                        [(r["id"], r["verdict"], fmt(worst_ratio(r), ".3g"), failure_summary(r) if r["verdict"] == FAILED
                          else "", Markup(f"<code>{escape(r['repro'])}</code>")) for r in unplotted])]
    body += ['<h2 id="margins">Tolerance margins</h2>',
             f'<p class="note">measured / bound of every check that has a tolerance (exact checks have bound 0 and '
             f"are not counted); 1 is the bound, {NEAR_FAILING_RATIO:g} the near-failing line.</p>",
             f'<img alt="histogram of measured/bound ratios" src="data:image/png;base64,{histogram}">' if histogram
             else f"<p>{escape(plots_missing() or 'No numerical checks ran.')}</p>"]
    if by_kind:  # across seeds (parity run --seeds K) this is how tight each bound is, per kind and dtype
        body += ['<h3 id="margins-by-kind">By check kind and dtype</h3>',
                 '<p class="note">the spread of measured / bound for each kind of toleranced check (its name before '
                 "'['), per case dtype: box = quartiles, whiskers = smallest to largest; the number is the largest "
                 "ratio, and the count beside the kind how many checks were folded in.</p>",
                 f'<img alt="measured/bound by check kind and dtype" src="data:image/png;base64,{by_kind}">']
    body += ['<h2 id="other">Known divergences, skips, closest passing cases</h2>']
    for status, title in ((DIVERGED, "Known divergences"), (XPASSED, "Known divergences that now match the reference "
                                                                      "(remove their marks)"), (SKIPPED, "Skipped")):
        if counts.get(status):
            body += [f"<h3>{title} ({counts[status]})</h3>", _reasons(records, status)]
    near = closest(records)
    if near:
        body += ["<h3>Passing cases closest to their bound</h3>",
                 _table(("case", "verdict", "ratio", "check"),
                        [(Markup(f'<span class="mono">{escape(r["id"])}</span>'), r["verdict"],
                          fmt(worst_ratio(r), ".3f"),
                          f"{(worst_check(r) or {}).get('name', '-')} {where(worst_check(r) or {})}") for r in near],
                        numeric=(2,))]
    modes = Counter(r["mode"] for r in records if r.get("mode"))
    body += ['<h2 id="environment">Environment</h2>',
             _table(("component", "version / value"), sorted((k, "-" if v is None else v) for k, v in run["environment"].items())),
             f"<p>wall time {run['wall_seconds']:.1f} s"
             + "".join(f"; {escape(m)} ({n} cases)" for m, n in sorted(modes.items())) + "</p>"]
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>parity run: {escape(headline(run))}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + f"\n<script>{IMAGE_PROBE}</script>\n</body></html>\n")
