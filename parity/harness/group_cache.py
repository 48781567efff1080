"""One process group per distinct request, for the life of a rank process.

A rank runs hundreds of cases, and some subjects make their groups anew in every case: Megatron's
``initialize_model_parallel`` creates about 17 groups per call and ``destroy_model_parallel`` only
drops its references, never destroying them. Each gloo group keeps three threads (two run loops and
a TCP loop) alive for as long as the process lives, so a rank of the default matrix held 1083
threads after ~20 minutes of ``pytest -n 2`` and the 2-core CI machine spent its time scheduling
them (load average 585; subprocess tests timed out). Giving a repeated request the group it got
before keeps the process at one group per distinct membership, and every rank still sees a fresh
subject state: the subjects' own globals are reset as before, only the communicator is shared.

Every rank of a case makes the same requests in the same order (they run the same code), so a
cached request is answered on all ranks alike and the collective that new_group would be is
skipped on all of them. A group someone destroys is forgotten, and a later request makes a new one.
"""
from __future__ import annotations

import functools

_cache: dict = {}
_installed = False
_originals: tuple = ()


def _key(args, kwargs):
    # new_group's parameters in order (torch 2.11-2.13); ranks as given: sort_ranks=False keeps an order
    names = ("ranks", "timeout", "backend", "pg_options", "use_local_synchronization", "group_desc", "device_id",
             "sort_ranks")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    ranks = bound.get("ranks")
    bound["ranks"] = None if ranks is None else tuple(int(r) for r in ranks)
    return tuple((k, repr(bound[k])) for k in sorted(bound))


def install() -> None:
    """Wrap torch.distributed.new_group / destroy_process_group in this process (idempotent)."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    global _originals
    original_new, original_destroy = _originals = dist.new_group, dist.destroy_process_group

    @functools.wraps(original_new)
    def new_group(*args, **kwargs):
        key = _key(args, kwargs)
        group = _cache.get(key)
        if group is None or group not in c10d._world.pg_map:  # destroyed behind our back: make it anew
            group = _cache[key] = original_new(*args, **kwargs)
        return group

    @functools.wraps(original_destroy)
    def destroy_process_group(group=None):
        if group is None:
            _cache.clear()
        else:
            for key in [k for k, g in _cache.items() if g is group]:
                del _cache[key]
        return original_destroy(group)

    dist.new_group, dist.destroy_process_group = new_group, destroy_process_group
    c10d.new_group, c10d.destroy_process_group = new_group, destroy_process_group
    _installed = True


def uninstall() -> None:
    """Put torch.distributed's own functions back (tests that install it in a shared process)."""
    global _installed
    if not _installed:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    dist.new_group, dist.destroy_process_group = _originals
    c10d.new_group, c10d.destroy_process_group = _originals
    _cache.clear()
    _installed = False
