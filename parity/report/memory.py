"""parity run --passes N: resident memory of this process and of every rank after each pass, so
growth from pass to pass (a cache without a bound, results kept alive, engines never freed) shows."""
from __future__ import annotations

MiB = float(1 << 20)


def rss_mib(pid: int | None = None) -> float | None:
    """Resident set size in MiB (None: the process is gone)."""
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / MiB
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def rss_snapshot(rank_pids: dict) -> dict:
    """{"parent": MiB, "ranks": {"w2-cpu": [MiB per rank, ...], ...}}; rank_pids as Runner.rank_pids()."""
    # ("jobs", ""): parity run -j's job processes, listed after the rank groups.
    return {"parent": rss_mib(), "ranks": {(f"w{world}-{device}" if isinstance(world, int) else world):
                                           [rss_mib(pid) for pid in pids]
                                           for (world, device), pids in sorted(rank_pids.items(), key=_group_order)}}


def _group_order(item):
    (world, device), _ = item
    return (not isinstance(world, int), world if isinstance(world, int) else 0, str(device))


def _mib(value) -> str:
    return "gone" if value is None else f"{value:.0f}"


def rss_line(number: int, wall_s: float, rank_pids: dict) -> str:
    snap = rss_snapshot(rank_pids)
    groups = "; ".join(f"{name} [{', '.join(_mib(v) for v in values)}]" for name, values in snap["ranks"].items())
    return f"pass {number}: {wall_s:.1f} s; RSS MiB parent {_mib(snap['parent'])}; ranks {groups or 'none alive'}"
