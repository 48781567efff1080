"""A small thread-safe LRU of bounded size for the checks' caches of pure results; a missed value is computed
outside the lock, the size is read at every store (or from a callable), and a key of None is never cached
(docs/checks.md#how-the-comparison-works)."""
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
        """Store value under key as the most recently used (a kept one stored again keeps its place); past
        maxsize, drop the least recently used entry."""
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
