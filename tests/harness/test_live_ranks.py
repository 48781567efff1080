"""A Runner keeps at most max_live_ranks rank processes alive: the default matrix's six world sizes
would otherwise hold 28 ranks (about 12 GB) per pytest-xdist worker."""
from parity.harness import runner as runner_module
from parity.harness.runner import Runner


class _FakePool:
    closed: list = []

    def __init__(self, world_size, device, log_dir=None, **settings):
        self.world_size, self.device = world_size, device

    def close(self, force=False):
        _FakePool.closed.append(self.world_size)


def test_least_recently_used_groups_close_to_make_room(monkeypatch):
    monkeypatch.setattr(runner_module, "RankPool", _FakePool)
    _FakePool.closed = []
    runner = Runner(max_live_ranks=9)
    for world in (2, 3, 4, 2):  # 9 ranks: all fit; 2 is now the most recently used
        runner.pool(world, "cpu")
    assert _FakePool.closed == []
    runner.pool(5, "cpu")  # needs 5 more: 3 then 4 close (least recently used), 2 stays
    assert _FakePool.closed == [3, 4]
    assert list(runner.pools) == [(2, "cpu"), (5, "cpu")]
    first = runner.pools[(2, "cpu")]
    assert runner.pool(2, "cpu") is first  # a warm group is reused, not restarted


def test_a_group_larger_than_the_limit_runs_alone(monkeypatch):
    monkeypatch.setattr(runner_module, "RankPool", _FakePool)
    _FakePool.closed = []
    runner = Runner(max_live_ranks=4)
    runner.pool(2, "cpu")
    runner.pool(8, "cpu")
    assert _FakePool.closed == [2]
    assert list(runner.pools) == [(8, "cpu")]


def test_jobs_inherit_the_limit():
    from parity.harness.job_processes import job_runner

    jobs = job_runner(3, max_live_ranks=5)
    assert jobs.jobs == 3 and jobs.settings["runner"]["max_live_ranks"] == 5
