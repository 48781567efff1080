"""A small thread-safe LRU of bounded size, shared by the checks' caches of pure results (the
reference pairs of parity.checks.compare, the rounding spreads of parity.checks.rounding, the stage
references of parity.checks.stages).

Only the lookup and the store take the lock: the caller computes a missed value outside it, so
parallel jobs (parity run -j) overlap, and two of them may compute one key at once; the results are
the same numbers (pure functions), so whichever is stored last is kept.

The size is read at every store, from a zero-argument callable where one is given, so a module's
size constant can be changed after the cache is made (tests monkeypatch it).

A key of None means "not cacheable" (Subject.reference_key returns None for a subject with its own
reference): it is never found, counted as a miss, and never stored.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable


class BoundedCache:
    def __init__(self, maxsize: int | Callable[[], int], *, stats: bool = False):
        self._maxsize = maxsize
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        # {"hits": n, "misses": n}, counted by get; None when not asked for.
        self.stats = {"hits": 0, "misses": 0} if stats else None

    @property
    def maxsize(self) -> int:
        return self._maxsize() if callable(self._maxsize) else self._maxsize

    def get(self, key, default: Any = None):
        """The value stored under key (now the most recently used), or default."""
        with self._lock:
            if key is not None and key in self._items:
                self._items.move_to_end(key)
                if self.stats is not None:
                    self.stats["hits"] += 1
                return self._items[key]
            if self.stats is not None:
                self.stats["misses"] += 1
            return default

    def put(self, key, value) -> None:
        """Store value under key: a new key as the most recently used (a kept one, stored again by a
        second job that computed it at once, keeps its place); past maxsize, drop the least recently
        used entry."""
        if key is None:
            return
        with self._lock:
            self._items[key] = value
            if len(self._items) > self.maxsize:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry (the stats are kept)."""
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._items
