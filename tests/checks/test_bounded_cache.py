"""parity.checks.bounded_cache: the LRU behind the reference, rounding-spread and stage caches."""
import threading

from parity.checks import compare, rounding, stages
from parity.checks.bounded_cache import BoundedCache
from parity.settings import DEFAULT_REFERENCE_CACHE_SIZE, RunSettings


def test_get_put_and_least_recently_used_eviction():
    cache = BoundedCache(2)
    assert cache.get("a") is None and cache.get("a", 0) == 0
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)  # so "b" goes
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2
    cache.put("a", 10)  # a store under a kept key replaces its value but keeps its place (c is newer)
    assert cache.get("c") == 3  # now a is the oldest
    cache.put("d", 4)
    assert "a" not in cache and "c" in cache
    cache.put("c", 30)
    cache.put("e", 5)
    assert "c" not in cache and cache.get("d") == 4
    cache.clear()
    assert len(cache) == 0 and not cache


def test_none_is_never_stored_and_counts_as_a_miss():
    cache = BoundedCache(4, stats=True)
    cache.put(None, 1)
    assert len(cache) == 0 and cache.get(None) is None
    cache.put("k", 1)
    cache.get("k")
    cache.get("other")
    assert cache.stats == {"hits": 1, "misses": 2}
    cache.clear()
    assert cache.stats == {"hits": 1, "misses": 2}  # clearing keeps the counts
    assert BoundedCache(1).stats is None


def test_the_size_is_read_at_every_store():
    size = {"n": 2}
    cache = BoundedCache(lambda: size["n"])
    cache.put("a", 1)
    size["n"] = 0  # a module's size constant set to 0 after its cache was made (tests monkeypatch them)
    cache.put("b", 2)
    assert "a" not in cache and len(cache) == 1  # one entry (the oldest) dropped per store, as before the class
    cache.put("c", 3)
    assert len(cache) == 1


def test_the_module_size_names_still_govern_their_caches(monkeypatch):
    for module, name, cache in ((rounding, "SPREAD_CACHE_SIZE", rounding._cache),
                                (stages, "_CACHE_SIZE", stages._CACHE)):
        assert cache.maxsize == getattr(module, name)
        monkeypatch.setattr(module, name, 0)
        assert cache.maxsize == 0, name


def test_the_reference_cache_takes_its_bound_from_the_run_settings():
    assert compare.ReferenceCache().memory.maxsize == DEFAULT_REFERENCE_CACHE_SIZE
    off = compare.ReferenceCache.from_settings(RunSettings(reference_cache_size=0))  # --no-reference-cache
    assert off.memory.maxsize == 0 and off.disk is None
    assert off.stats() == off.memory.stats == {"hits": 0, "misses": 0}


def test_threads_share_one_cache():
    cache = BoundedCache(1000, stats=True)

    def work(offset):
        for i in range(200):
            if cache.get((offset + i) % 300) is None:
                cache.put((offset + i) % 300, i)

    threads = [threading.Thread(target=work, args=(n * 50,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 300
    assert cache.stats["hits"] + cache.stats["misses"] == 800
