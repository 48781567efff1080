"""Collective counts as an observable: which collectives a subject issues, per micro-batch.

Numbers can agree while the communication is wrong: a dropped collective whose result happens not
to matter at the case's shape, or an extra one that leaves every value as it was (a stray
synchronizing all-reduce, a broadcast where an all-reduce was meant). Counting the collectives
catches those where the numeric checks cannot (PyTorch's ``CommDebugMode`` / ``ExpCommCounts``
idea; anchors.md).

How: in each rank process the public collectives of ``torch.distributed`` are wrapped once
(``install``). DeepSpeed's ``deepspeed.comm`` torch backend and Liger both call them through the
``torch.distributed`` module at call time, so every collective they issue passes a wrapper; an
inner call made by a wrapped function is not counted again. The wrappers count only inside a
``recording()`` window, which a subject opens around the forward and backward of its head and
loss, one window per micro-batch. A count is keyed ``"<kind>@<group size>"``, e.g. ``all_reduce@2``.

DTensor does not call those: its redistributions and ``loss_parallel`` issue functional collectives
(``torch.distributed._functional_collectives``, looked up on that module at call time), so those
functions are wrapped too and counted under the kind of the c10d collective they stand for
(``FUNCOL_KINDS``): a DTensor all-gather of logits and a DeepSpeed one read alike in a case file.

``CommDebugMode`` was not used: it sees only collectives that go through the dispatcher as c10d
ops with DTensor/functional collectives in mind, and it keys by op, not by group, so it cannot
tell a TP-group all-reduce from a world-group one.

Engine subjects exclude the engine's gradient reduction: their window closes before
``engine.backward``'s all-reduce of gradients (see deepspeed_autotp.EngineHead.run_rank), and
collectives on the engine's data-parallel group are not counted (ZeRO reduces there, inside
backward hooks, depending on the stage).
"""
from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections import Counter

# The public collectives of torch.distributed (kind names as they appear in case files).
KINDS = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
         "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "reduce", "all_to_all",
         "all_to_all_single", "all_reduce_coalesced", "gather", "scatter", "barrier", "send", "recv",
         "isend", "irecv")

# functional collective -> the kind it is counted as (group resolved from its group argument)
FUNCOL_KINDS = {"all_reduce": "all_reduce", "all_gather_tensor": "all_gather_into_tensor",
                "all_gather_single": "all_gather_into_tensor", "reduce_scatter_tensor": "reduce_scatter_tensor",
                "reduce_scatter_single": "reduce_scatter_tensor", "all_to_all_single": "all_to_all_single",
                "broadcast": "broadcast", "all_reduce_coalesced": "all_reduce_coalesced"}

# The recording window is process-wide, not per thread: on CUDA, autograd runs a backward on its
# own device thread, so a collective issued in backward (Megatron's all-reduce of the head input's
# gradient, in _CopyToModelParallelRegion.backward) happened outside a thread-local window and was
# not counted (4 megatron_vocab_parallel cuda cases counted 3 all-reduces for 4). A rank runs one
# case at a time, so one window per process is exact. Only the guard against counting a wrapped
# function's inner calls twice is per thread: that nesting happens within one thread's stack.
_window = types.SimpleNamespace(counts=None)
_state = threading.local()  # .depth: inside a counted call on this thread
_installed = False
_ignored_groups: list = []  # groups whose collectives are never counted (the engine's DP group)


def _group_size(dist, args, kwargs, fn_name):
    if "group" in kwargs:
        group = kwargs["group"]
    else:
        import inspect

        sig = _signatures.get(fn_name)
        if sig is None:
            sig = _signatures[fn_name] = inspect.signature(_originals[fn_name])
        try:
            group = sig.bind_partial(*args, **kwargs).arguments.get("group")
        except TypeError:
            group = None
    return group, dist.get_world_size(group)


_signatures: dict = {}
_originals: dict = {}


def install(trace: bool = False) -> None:
    """Wrap torch.distributed's collectives in this process (idempotent); trace: print each counted
    call's stack to the rank log (RunSettings.trace_collectives, PARITY_TRACE_COLLECTIVES)."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist

    for kind in KINDS:
        original = getattr(dist, kind, None)
        if original is None:
            continue
        _originals[kind] = original

        def wrapper(*args, __kind=kind, __original=original, __trace=trace, **kwargs):
            counts = _window.counts
            if counts is None or getattr(_state, "depth", 0):
                return __original(*args, **kwargs)
            group, size = _group_size(dist, args, kwargs, __kind)
            if not any(group is g for g in _ignored_groups):
                counts[f"{__kind}@{size}"] += 1
                if __trace:
                    import traceback

                    print(f"=== collective {__kind}@{size}:\n" + "".join(traceback.format_stack(limit=8)[:-1]),
                          flush=True)
            _state.depth = 1
            try:
                return __original(*args, **kwargs)
            finally:
                _state.depth = 0

        functools.update_wrapper(wrapper, original)
        setattr(dist, kind, wrapper)
    _install_functional(trace)
    _installed = True


def _install_functional(trace: bool) -> None:
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d

    for name, kind in FUNCOL_KINDS.items():
        original = getattr(funcol, name, None)
        if original is None:
            continue

        def wrapper(*args, __kind=kind, __name=name, __original=original, __trace=trace, **kwargs):
            counts = _window.counts
            if counts is None or getattr(_state, "depth", 0):
                return __original(*args, **kwargs)
            import inspect

            sig = _signatures.get("funcol." + __name)
            if sig is None:
                sig = _signatures["funcol." + __name] = inspect.signature(__original)
            group = sig.bind_partial(*args, **kwargs).arguments.get("group")
            size = c10d._resolve_process_group(funcol._resolve_group_name(group)).size()
            counts[f"{__kind}@{size}"] += 1
            if __trace:
                import traceback

                print(f"=== collective {__kind}@{size} (functional {__name}):\n"
                      + "".join(traceback.format_stack(limit=8)[:-1]), flush=True)
            _state.depth = 1
            try:
                return __original(*args, **kwargs)
            finally:
                _state.depth = 0

        functools.update_wrapper(wrapper, original)
        setattr(funcol, name, wrapper)


@contextlib.contextmanager
def recording(counts: Counter | None = None):
    """Count the collectives issued inside the block into ``counts`` (a Counter, returned)."""
    install()
    counts = Counter() if counts is None else counts
    previous = _window.counts
    _window.counts = counts
    try:
        yield counts
    finally:
        _window.counts = previous


@contextlib.contextmanager
def paused():
    """No counting inside (e.g. the engine's own gradient reduction within a recorded window)."""
    previous = _window.counts
    _window.counts = None
    try:
        yield
    finally:
        _window.counts = previous


def ignore_group(group) -> None:
    if group is not None and not any(group is g for g in _ignored_groups):
        _ignored_groups.append(group)


def expected_counts(declared: dict, tp: int, first: bool = False) -> dict:
    """Case-file declaration -> expected counts of one micro-batch: ``kind = n`` means n of kind on a
    group of size tp; ``"kind@N" = n`` names the group size; a ``first`` table adds its counts on the
    case's first micro-batch. Zero counts are dropped (absence is what is checked)."""
    out = {}
    items = list(declared.items()) + (list(dict(declared.get("first", ())).items()) if first else [])
    for key, n in items:
        if key == "first":
            continue
        full = key if "@" in key else f"{key}@{tp}"
        if n:
            out[full] = out.get(full, 0) + n
    return out
