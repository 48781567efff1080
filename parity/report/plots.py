"""Figures for report.html, as base64 PNG (matplotlib's Agg backend: no display, no network)."""
from __future__ import annotations

import base64
import io
import math

from parity.report.records import check_results, worst_ratio
from parity.checks.tolerances import NEAR_FAILING_RATIO

MAX_PANELS = 12  # tensors (lines) per case figure, worst ratio first; the page says when more were left out


def missing() -> str | None:
    """Why report.html has no plots here, or None: matplotlib is the `report` extra, not a core need."""
    from importlib.util import find_spec

    if find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install 'tp-parity[report]'), so report.html has no plots"
    return None


def preload() -> None:
    """Imports what drawing needs (half a second), so that worker processes forked after this
    (parity.report.workers) share one import instead of each making its own."""
    if missing():
        return
    import matplotlib.ticker  # noqa: F401
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401
    from PIL import Image  # noqa: F401


def _figure(figsize):
    """A figure on matplotlib's Agg canvas, apart from pyplot: no backend to switch, no global list
    of open figures to close; drawn at the page's 72 dpi."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=72)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> str:
    from PIL import Image  # matplotlib's own dependency

    # The canvas's pixels straight to Pillow: a PNG written by matplotlib only to be read back
    # would be encoded and decoded once more for each figure.
    fig.canvas.draw()
    pixels = Image.frombuffer("RGBA", fig.canvas.get_width_height(physical=True), fig.canvas.buffer_rgba(),
                              "raw", "RGBA", 0, 1)
    # Line plots need few colours: a 64-colour palette makes the page about three times smaller.
    small = io.BytesIO()
    pixels.convert("RGB").quantize(colors=64).save(small, format="PNG", optimize=True)
    return base64.b64encode(small.getvalue()).decode("ascii")


def plotted_series(record: dict) -> dict:
    """check name -> rank -> [(x, measured, bound)] for the toleranced checks of each step:
    x is the step, plus micro/micro-batches for per-micro-batch tensors."""
    checks = [c for c in check_results(record) if c.get("step") is not None and c.get("bound")
              and c.get("measured") is not None]
    micros = 1 + max((c["micro"] for c in checks if c.get("micro") is not None), default=0)
    series: dict = {}
    for c in checks:
        x = c["step"] + (c["micro"] / micros if c.get("micro") is not None else 0.0)
        series.setdefault(c["name"], {}).setdefault(c.get("rank"), []).append((x, c["measured"], c["bound"]))
    return series


class CaseCanvas:
    """One figure and axes on which a report draws its case figures one after another.

    A new figure per case built its axes, ticks and text again each time, and the renderer's
    cache of text sizes died with each figure: a third of the time of drawing a case. Before a
    case is drawn, what the last one left (its lines, its legend, its data limits) is removed, and
    the y scale is linear again while lines are added, as on a fresh figure: the bound's line at 1
    counted in log coordinates enters the data limits as 0.999999999999998, which moves the axis.
    A case is drawn pixel for pixel as on a new figure (tests/report/test_plots.py)."""

    def __init__(self):
        from matplotlib.ticker import MaxNLocator

        self.fig = _figure((9.0, 3.2))
        self.ax = ax = self.fig.subplots()
        ax.set_ylabel("measured / bound", fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        self.fig.subplots_adjust(left=0.08, right=0.7, top=0.95, bottom=0.15)

    def _clear(self) -> None:
        ax = self.ax
        for line in list(ax.lines):
            line.remove()
        if ax.legend_ is not None:
            ax.legend_.remove()
        ax.relim()
        ax.set_yscale("linear")

    def draw(self, names: list[str], folded: dict) -> str:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

        self._clear()
        ax = self.ax
        for i, name in enumerate(names):
            # Zero error has no place on a log axis: those points are left out.
            shown = [(x, r) for x, r in folded[name] if r > 0]
            ax.plot([x for x, _ in shown], [r for _, r in shown], marker="o", color=f"C{i % 10}",
                    ls="-" if i < 10 else "--", ms=3, lw=1, label=name)
            over = [(x, r) for x, r in shown if r > 1]
            if over:
                ax.plot([x for x, _ in over], [r for _, r in over], "x", color="red", ms=8, mew=2)
        ax.axhline(1.0, color="red", lw=1.2)
        ax.axhline(NEAR_FAILING_RATIO, color="orange", lw=1, ls="--")
        ax.set_yscale("log")  # resets the y locators and formatter to the log scale's: set again
        # Decades only, labelled 1e-07 rather than mathtext: tick layout was most of the drawing time.
        ax.yaxis.set_major_locator(LogLocator(numticks=6))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        return _png(self.fig)


def case_figure(record: dict, canvas: CaseCanvas | None = None) -> tuple[str | None, int]:
    """measured / bound per step for each tensor, one line per tensor on one panel (a tensor's ranks
    folded into the worst one at each point): (base64 PNG or None, tensors left out). canvas: the
    report's CaseCanvas (None: a new one, for this figure alone).

    One panel, not one per tensor: matplotlib's cost is per axes (ticks, text), and a report draws
    up to MAX_PLOTTED_CASES of these; twelve panels a case made writing the report take most of a
    minute. The per-rank numbers are in the case's tables and in results.jsonl."""
    series = plotted_series(record)
    if not series or missing():
        return None, 0
    folded = {}
    for name, ranks in series.items():
        worst: dict = {}
        for points in ranks.values():
            for x, m, b in points:
                worst[x] = max(worst.get(x, 0.0), m / b)
        folded[name] = sorted(worst.items())
    names = sorted(folded, key=lambda n: max(r for _, r in folded[n]), reverse=True)[:MAX_PANELS]
    return (canvas or CaseCanvas()).draw(names, folded), len(series) - len(names)


def case_figures(records: list[dict], positions: list[int]) -> list[tuple[str | None, int]]:
    """case_figure of records[i] for each i in positions, on one canvas (a report part:
    parity.report.workers)."""
    canvas = CaseCanvas() if positions and not missing() else None
    return [case_figure(records[i], canvas) for i in positions]


def ratio_histogram(records: list[dict]) -> str | None:
    """Measured/bound across the run: every toleranced check, and each case's worst."""
    import numpy as np

    # A default run has ~700k checks: gathered once into arrays, binned by numpy, drawn as bars
    # (ax.hist on a list that long spent seconds converting it).
    per_check = np.array([c["ratio"] for r in records for c in check_results(r)
                          if c.get("bound") and c.get("ratio") is not None], dtype=float)
    per_case = np.array([worst_ratio(r) for r in records if worst_ratio(r) is not None], dtype=float)
    if (not per_check.size and not per_case.size) or missing():
        return None
    from matplotlib.ticker import FuncFormatter, NullLocator

    low, high = -6.0, 2.0  # log10 of the ratio; anything beyond is counted in the edge bins
    bins = [low + i * 0.25 for i in range(int((high - low) / 0.25) + 1)]
    fig = _figure((11, 3.2))
    axes = fig.subplots(1, 2)
    for ax, values, title in ((axes[0], per_check, "every toleranced check"), (axes[1], per_case, "worst check of each case")):
        zeros = int(np.count_nonzero(values == 0))
        positive = values[values > 0]
        with np.errstate(divide="ignore", over="ignore"):
            logs = np.clip(np.where(np.isfinite(positive), np.log10(positive), high), low, high)
        heights, edges = np.histogram(logs, bins=bins)
        ax.bar(edges[:-1], heights, width=np.diff(edges), align="edge", color="#4a78b0")  # what ax.hist draws
        ax.axvline(0.0, color="red", lw=1.5, label="bound (ratio 1)")
        ax.axvline(math.log10(NEAR_FAILING_RATIO), color="orange", lw=1.5, ls="--",
                   label=f"near-failing ({NEAR_FAILING_RATIO:g})")
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("log10(measured / bound); the edge bins hold everything beyond", fontsize=8)
        ax.set_title(f"{title}: {values.size}" + (f" ({zeros} exactly zero, not drawn)" if zeros else ""), fontsize=9)
        ax.set_xlim(low - 0.1, high + 0.1)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.06, right=0.99, top=0.9, bottom=0.16, wspace=0.15)
    return _png(fig)


def ratios_by_kind(records: list[dict]) -> dict:
    """(case dtype, check kind) -> every measured/bound ratio of that kind's toleranced checks; the
    kind is the check name before its '[' (grad[lm_head.weight] -> grad), the dtype the case's."""
    out: dict = {}
    for r in records:
        dtype = (r.get("axes") or {}).get("dtype")
        if dtype is None:
            continue
        for c in check_results(r):
            if c.get("bound") and c.get("ratio") is not None:
                out.setdefault((dtype, c["name"].split("[")[0]), []).append(c["ratio"])
    return out


def ratio_by_kind_figure(records: list[dict]) -> str | None:
    """How tight each bound is: per case dtype, the spread of measured/bound for each check kind
    (box = quartiles, whiskers = smallest to largest, the largest written beside it)."""
    ratios = ratios_by_kind(records)
    if not ratios or missing():
        return None
    order = {"fp32": 0, "bf16": 1, "fp16": 2}
    dtypes = sorted({d for d, _ in ratios}, key=lambda d: order.get(d, 9))
    kinds = sorted({k for _, k in ratios})
    import matplotlib

    # matplotlib 3.10 replaced boxplot's vert=False by orientation= (vert warns from 3.11); pyproject allows 3.8
    major, minor = (int(p) for p in matplotlib.__version__.split(".")[:2])
    horizontal = {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}
    low = -8.0  # log10; a ratio of exactly 0 (bitwise equal to the oracle) is counted, not drawn
    fig = _figure((4.6 * len(dtypes), 0.32 * len(kinds) + 1.2))
    axes = fig.subplots(1, len(dtypes), squeeze=False, sharey=True)
    for ax, dtype in zip(axes[0], dtypes):
        data, labels = [], []
        for kind in kinds:
            values = ratios.get((dtype, kind), [])
            positive = [max(math.log10(v), low) if math.isfinite(v) else 2.0 for v in values if v > 0]
            data.append(positive or [float("nan")])
            labels.append(f"{kind} ({len(values)})")
        ax.boxplot(data, whis=(0, 100), widths=0.6, showfliers=False, **horizontal)
        for y, (kind, values) in enumerate(((k, ratios.get((dtype, k), [])) for k in kinds), start=1):
            if values:
                worst = max(values)
                ax.text(1.95, y, f"{worst:.2g}", va="center", ha="right", fontsize=6,
                        color="red" if worst > 1 else "black")
        ax.axvline(0.0, color="red", lw=1.2)
        ax.axvline(math.log10(NEAR_FAILING_RATIO), color="orange", lw=1, ls="--")
        ax.set_yticks(range(1, len(kinds) + 1), labels, fontsize=7)
        ax.set_xlim(low - 0.2, 2.0)
        ax.set_title(f"{dtype}: log10(measured / bound), largest at right", fontsize=8)
        ax.tick_params(labelsize=7)
    width, height = 4.6 * len(dtypes), 0.32 * len(kinds) + 1.2
    fig.set_size_inches(width + 1.2, height)  # 1.2 in more for the kind labels on the left
    fig.subplots_adjust(left=1.3 / (width + 1.2), right=0.99, top=1 - 0.3 / height, bottom=0.4 / height, wspace=0.08)
    return _png(fig)
