"""What the reproducers beside this file share: a free port, the torch.distributed environment, a
gloo group, N spawned ranks whose results come back to the parent, and a timeout so nothing hangs.

ci/repro is not a package: a script run as ``python ci/repro/NAME.py`` has its own directory first
on sys.path, and spawned ranks inherit the parent's sys.path, so ``import _ranks`` works in both.
Nothing here but the standard library and torch.
"""
import os
import socket
import time

import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 300  # a reproducer takes 5-30 s; past this its ranks are hung in a collective


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_rank_env(rank: int, world: int, port: int) -> None:
    """The variables torchrun sets, which env:// init (torch's and DeepSpeed's) reads."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def init_gloo(rank: int = 0, world: int = 1) -> None:
    """A gloo group over env:// (a one-process group on a free port when the environment has none)."""
    if "MASTER_PORT" not in os.environ:
        set_rank_env(rank, world, free_port())
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _rank(rank, fn, world, port, result, env, init, args):
    set_rank_env(rank, world, port)
    os.environ.update(env)
    if init:
        init_gloo(rank, world)
    fn(rank, result, *args)
    if init and dist.is_initialized():
        dist.destroy_process_group()


def run_ranks(fn, world: int, *args, env=None, init: bool = True, timeout: float = TIMEOUT_S) -> dict:
    """Run ``fn(rank, result, *args)`` on ``world`` spawned processes and return, as a plain dict, what
    they stored in ``result`` (a Manager dict: store picklable values).

    Each rank has the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT on a
    free port) plus ``env``; with ``init`` it joins a gloo group over it before ``fn`` and leaves it
    after (``init=False``: ``fn`` makes its own, e.g. through deepspeed.init_distributed). ``fn`` must be
    a module-level function of the script (spawn pickles it by name). A rank that raises fails the run
    as torch.multiprocessing.spawn does (its traceback in the error); ranks still running after
    ``timeout`` seconds are killed and TimeoutError is raised."""
    with mp.Manager() as manager:
        result = manager.dict()
        context = mp.start_processes(_rank, args=(fn, world, free_port(), result, env or {}, init, args),
                                     nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not context.join(timeout=max(deadline - time.monotonic(), 0)):
            if time.monotonic() >= deadline:
                alive = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
                for p in context.processes:
                    p.kill()
                    p.join()
                raise TimeoutError(f"ranks {alive} of {world} still running after {timeout:.0f} s: killed")
        return dict(result)
