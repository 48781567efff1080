"""The body of one rank process: join the process group, then run cases until told to stop.

send_output_to, prepare_process and run_case are shared with the torchrun launcher
(parity/torchrun_launch.py), so both paths run a case the same way.

Everything a rank prints (DeepSpeed's logs, C++ warnings, faulthandler dumps) goes to its own log
file, so the parent can quote a dead or stuck rank's stack in that case's verdict.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
import traceback
from datetime import timedelta

CASE_COLLECTIVE_TIMEOUT_S = 600
# A CPU rank's environment: DeepSpeed's CPU accelerator, Liger's Triton kernels in Triton's
# interpreter (read when triton is imported and kernels are defined), and no CUDA device: a CPU rank
# stands for a CPU-only machine, and on a CUDA host it is forked from a forkserver whose imports may
# have touched CUDA, after which any CUDA call in the child fails ("CUDA error: initialization
# error"). torch.optim.Adam's step asks torch.cuda whether a graph is being captured whenever CUDA is
# available: every AdamW case (the universal-checkpoint subjects) failed so on the H200 host's CPU.
CPU_RANK_ENV = {"DS_ACCELERATOR": "cpu", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


def prepare_process(device: str) -> None:
    """Environment and torch settings every rank process needs, whoever launched it."""
    if device == "cpu":
        for key, value in CPU_RANK_ENV.items():
            os.environ.setdefault(key, value)
    else:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    import torch

    # Bitwise-repeatable runs: one thread (no racing partial sums), deterministic kernels. On CUDA
    # some kernels have no deterministic variant: warn rather than refuse.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=device != "cpu")


def send_output_to(log_path) -> object:
    """Everything this process prints (Python, C++ and CUDA libraries alike) goes to log_path."""
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    return log


# What a framework may replace process-wide and leave replaced after its case: torch's own functions
# (parity.observe.process_functions.TORCH_FUNCTIONAL) are put back before every case. DeepSpeed's
# zero.Init (ZeRO 3) swaps torch.nn.functional.linear for its own zero3_linear_wrap and keeps it ("This will persist unless manually reset", printed only with
# force=False): every later model in the process then runs its Linear layers through ZeRO 3's
# autograd function. A rank runs many cases; a user's training starts a fresh process. Found by
# `parity explore --seed 3`: a bf16 tied_vocab_parallel ZeRO 0 case measured 2.665e-3 on an embedding
# gradient after a column_gathered ZeRO 3 case had run in the same ranks, 1.932e-3 in fresh ones.


def restore_process_globals() -> list[str]:
    """Put back what a previous case replaced (see above); the names of what was put back."""
    import torch.nn.functional as F

    from parity.observe.process_functions import TORCH_FUNCTIONAL

    restored = []
    for name, original in TORCH_FUNCTIONAL.items():
        if getattr(F, name) is not original:
            setattr(F, name, original)
            restored.append(f"torch.nn.functional.{name}")
    return restored


def run_case(seq: int, subject_name: str, values: dict, ctx) -> tuple[str, object]:
    """One case on this rank: ("ok", RankObservations) or ("error", {type, message, traceback})."""
    import torch

    from parity.subjects import SUBJECTS

    print(f"=== case {seq}: {subject_name} {values}", flush=True)
    restore_process_globals()
    try:
        subject = SUBJECTS[subject_name]
        state = subject.reset_process_state(ctx)
        torch.manual_seed(seq)  # nothing may depend on it; the subject seeds its own model and data
        obs = subject.run_rank(values, ctx)
        obs.facts["state_at_start"] = state
        obs.facts["rank_device"] = str(torch.device(ctx.device))  # where its tensors must live (contract)
        return "ok", obs
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the judge
        # A subject may attach what it saw on the way out (the model's state after a refused setup).
        facts = getattr(exc, "parity_facts", None)
        return "error", {"type": type(exc).__name__, "message": error_message(exc), "traceback": traceback.format_exc(),
                         "facts": facts if isinstance(facts, dict) else {}}


def error_message(exc: BaseException) -> str:
    """The exception's text, or, for a bare ``assert`` (an empty message), the statement that failed and where: a
    verdict saying only "AssertionError:" names nothing a reader or a crash mark could tell apart."""
    if str(exc):
        return str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or not frames[-1].line:
        return ""
    last = frames[-1]
    where = "/".join(last.filename.split("/")[-3:])
    return f"{last.line.strip()} ({where}:{last.lineno})"


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Linux: the kernel sends ``signum`` to this process when the process that started it dies, even
    by SIGKILL (a job process of parity run -j killed for memory): an orphaned rank would wait on its
    task queue for ever. A job process asks for SIGTERM, which closes its rank groups first."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):
        pass


def _die_with_owner(owner: int | None) -> None:
    """Exit when ``owner`` (the process that made this rank's group) is gone. A rank forked from a
    forkserver has the forkserver as its parent, and the forkserver outlives a killed owner: every
    rank it forked holds the write end of its "client alive" pipe (multiprocessing passes it on, so a
    child could use the forkserver too), so it never sees EOF and never exits, and PDEATHSIG
    (die_with_parent) never fires. Measured: a `parity run` stopped by SIGTERM left its forkserver and five ranks waiting on
    their queues 36 minutes later. A thread here waits for the owner's exit and ends this process."""
    if owner is None or owner == os.getppid():
        return  # spawned by the owner itself: PDEATHSIG covers it
    import threading

    def watch():
        try:
            import select

            fd = os.pidfd_open(owner)  # Linux 5.3: readable once the process has exited
            select.select([fd], [], [])
        except (AttributeError, OSError):
            while True:  # no pidfd: ask every second
                time.sleep(1.0)
                try:
                    os.kill(owner, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    continue
        os._exit(1)

    threading.Thread(target=watch, name="parity-owner-watch", daemon=True).start()


def rank_main(rank: int, world_size: int, device: str, store_port: int, task_queue, result_queue,
              log_path: str, environ: dict | None = None, owner: int | None = None,
              settings: dict | None = None) -> None:
    """settings: the run's (RunSettings.as_dict(); None: this process's PARITY_* variables)."""
    if environ is not None:
        # A forked rank has the forkserver's environment, from when it started; the parent's is what
        # counts now (tests set variables; the subject registry's PARITY_SUBJECT_MODULES).
        os.environ.clear()
        os.environ.update(environ)
    log = send_output_to(log_path)
    preload = sys.modules.get("parity.harness.cpu_rank_preload")  # forked from a CPU forkserver
    if preload is not None:
        preload.replay_warnings(log)
    die_with_parent()
    _die_with_owner(owner)
    # A terminal's Ctrl-C reaches the whole process group; the parent decides what it means (a
    # partial report) and stops its ranks itself, so a rank must not die mid-case on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable(file=log, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port))
    prepare_process(device)
    restore_process_globals()  # torch's own, whatever an import left, before any case

    import torch.distributed as dist

    from parity.mutation.catalog import apply_named
    from parity.harness.placement import place_rank, use_placement
    from parity.settings import RunSettings
    from parity.subjects.base import RankContext

    run = RunSettings(**settings) if settings is not None else RunSettings.from_env()

    placement = place_rank(rank, world_size, device)
    use_placement(placement)
    # Collective counts (parity/observe/collectives.py): wrap torch.distributed's collectives before
    # DeepSpeed's comm layer binds any of them (it keeps e.g. all_gather_into_tensor at init).
    from parity.observe import collectives

    collectives.install(trace=run.trace_collectives)
    # One process group per distinct membership for the rank's whole life (parity/harness/group_cache.py).
    from parity.harness import group_cache

    group_cache.install()
    # The parent holds the store on a port it bound itself, so concurrent pools never collide.
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=120))
    # No device_id: with it, DeepSpeed's group splitting fails on a shared GPU (liger-and-gpu.md).
    dist.init_process_group(placement.backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=CASE_COLLECTIVE_TIMEOUT_S))
    ctx = RankContext(rank=rank, world_size=world_size, device=placement.device, mode=placement.mode)
    # Mutation check only (ci/mutation_check.py): the run's mutant plants one bug in this process.
    apply_named(run.mutant, "rank")
    result_queue.put(("ready", rank, 0, placement.mode, {}))

    while True:
        task = task_queue.get()
        if task is None:
            break
        # time.monotonic() is CLOCK_MONOTONIC, one clock for every process of the machine, so the
        # parent can tell the queue's transport (and pickling) from this rank's work (parity run --profile).
        received = time.monotonic()
        seq, subject_name, values = task
        kind, payload = run_case(seq, subject_name, values, ctx)
        result_queue.put((kind, rank, seq, payload, {"received": received, "done": time.monotonic()}))
    dist.destroy_process_group()
