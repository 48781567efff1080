"""A rank process keeps one process group per distinct new_group request (parity/harness/
group_cache.py): Megatron's per-case initialize_model_parallel leaked 17 gloo groups (51 threads)
per case without it."""
import os
import threading

import torch.distributed as dist

from parity.harness import group_cache


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()


def test_a_repeated_request_gets_the_same_group_and_a_destroyed_one_is_made_anew(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    group_cache.install()
    try:
        first = dist.new_group([0])
        before = _threads()
        for _ in range(5):
            assert dist.new_group([0]) is first
        again = dist.new_group(ranks=[0], group_desc="TENSOR_MODEL_PARALLEL_GROUP")
        assert dist.new_group(ranks=[0], group_desc="TENSOR_MODEL_PARALLEL_GROUP") is again
        assert _threads() <= before + 3  # at most the one new group's threads
        dist.destroy_process_group(first)
        assert dist.new_group([0]) is not first
    finally:
        dist.destroy_process_group()
        group_cache.uninstall()
