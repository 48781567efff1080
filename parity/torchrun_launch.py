"""parity run --launcher torchrun: the same cases and verdicts, with rank processes started by torchrun.

    torchrun --standalone --nproc-per-node 2 -m parity.cli run --launcher torchrun [parity run options]

Every process of the launch is one rank; RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
MASTER_ADDR/PORT come from torchrun (env:// rendezvous). Rank 0 is also the coordinator: it selects
the cases (parity.matrix.cases.select), posts each one on the rendezvous store, runs its own share, collects
every rank's outcome from the store and judges it with parity.harness.runner.judge, exactly as the
self-spawning runner does; every rank runs its share with parity.harness.rank_worker.run_case.

Where this differs from the self-spawn path (parity/harness/rank_pool.py):
- One world size per launch: selected cases of another size are listed as not run, with the
  launch that would run them (never dropped silently).
- A rank that hangs or dies breaks the process group for good (torchrun cannot replace one rank
  inside a job). Each rank's watchdog posts its own Python stack when its share of a case runs
  past --timeout, or past PEER_GRACE_S after a peer failed; torchrun stops every rank when one
  exits, and rank 0 turns that SIGTERM into a report. Either way rank 0 fails that case with what
  is known, lists the remaining cases as not run, writes the partial report and exits nonzero.
  A rank that raises while its peers finish (a rejection, an error after the last collective) is
  an ordinary case failure and the run goes on, as in the self-spawn path.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

from parity.matrix.cases import SelectionError
from parity.harness.rank_pool import PEER_GRACE_S, PoolOutcome, RankError
from parity.harness.rank_worker import CASE_COLLECTIVE_TIMEOUT_S, prepare_process, run_case, send_output_to

REQUIRED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# After a rank's watchdog fires, how long rank 0 waits for the other ranks' watchdogs to post.
REPORT_MARGIN_S = 5.0
# How long a rank waits for rank 0's next case: rank 0 computes references and judges in between.
NEXT_CASE_TIMEOUT_S = 1800


class LaunchError(Exception):
    pass


def rank_env() -> dict:
    missing = [k for k in REQUIRED_ENV if k not in os.environ]
    if missing:
        raise LaunchError(f"parity: --launcher torchrun needs {', '.join(missing)} in the environment, which "
                          f"torchrun sets; start it as `torchrun --nproc-per-node N -m parity.cli run "
                          f"--launcher torchrun ...` (or use plain `parity run`, which spawns its own ranks)")
    return {k: int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}


# -- the case protocol on the rendezvous store -----------------------------------------------------

def post_result(store, seq: int, rank: int, result: tuple) -> None:
    # The case body and its watchdog may both try to post; the first one counts.
    if store.add(f"claim/{seq}/{rank}", 1) != 1:
        return
    if result[0] != "ok":
        store.add(f"errors/{seq}", 1)
    store.set(f"result/{seq}/{rank}", pickle.dumps(result))


def lost_result(rank: int, thread_id: int, why: str, log_path: str) -> tuple:
    """What a stuck rank can still say: why, and where its case thread is."""
    frame = sys._current_frames().get(thread_id)
    stack = "".join(traceback.format_stack(frame)) if frame else "(no stack)"
    return ("lost", {"type": "RankLost", "message": why,
                     "traceback": f"{why}; stack of rank {rank} (log {log_path} on {socket.gethostname()}):\n{stack}"})


def run_watched(store, seq: int, subject: str, values: dict, ctx, timeout_s: float, log_path: str,
                on_lost=None) -> None:
    """This rank's share of one case, posted to the store; a watchdog posts the stack if it gets stuck."""
    done = threading.Event()
    main_thread = threading.get_ident()
    start = time.monotonic()

    def watch():
        first_error_at = None
        while not done.wait(0.5):
            now = time.monotonic()
            if first_error_at is None and store.add(f"errors/{seq}", 0) > 0:
                first_error_at = now
            if now - start > timeout_s:
                why = f"no result within {timeout_s:.0f} s"
            elif first_error_at is not None and now - first_error_at > PEER_GRACE_S:
                why = f"still running {PEER_GRACE_S:.0f} s after a peer failed (stuck in a collective?)"
            else:
                continue
            post_result(store, seq, ctx.rank, lost_result(ctx.rank, main_thread, why, log_path))
            if on_lost:
                on_lost()
            return

    threading.Thread(target=watch, daemon=True, name="parity-case-watchdog").start()
    result = run_case(seq, subject, values, ctx)
    done.set()
    post_result(store, seq, ctx.rank, result)


def collect(store, seq: int, world_size: int, deadline: float, missing_why: str) -> PoolOutcome:
    outcome, pending = PoolOutcome(), set(range(world_size))
    while pending:
        for rank in sorted(pending):
            key = f"result/{seq}/{rank}"
            if not store.check([key]):
                continue
            kind, payload = pickle.loads(store.get(key))
            store.delete_key(key)
            pending.discard(rank)
            if kind == "ok":
                outcome.observations[rank] = payload
            else:
                outcome.errors[rank] = RankError(rank, payload["type"], payload["message"], payload["traceback"],
                                                 payload.get("facts") or {})
                outcome.broken |= kind == "lost"
        if pending and time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for rank in pending:
        outcome.errors[rank] = RankError(rank, "RankLost", missing_why, missing_why)
        outcome.broken = True
    return outcome


# -- every rank --------------------------------------------------------------------------------------

def cmd_run_torchrun(args, settings) -> int:
    """This process as one rank of a torchrun launch; settings: the run's (parity.cli.cmd_run)."""
    try:
        env = rank_env()
    except LaunchError as exc:
        print(exc, file=sys.stderr)
        return 2
    rank, world_size = env["RANK"], env["WORLD_SIZE"]
    device = args.device or "cpu"
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")  # one folder per launch, shared by a node's ranks
    log_dir = Path(args.logs or tempfile.gettempdir()) / f"parity-torchrun-{run_id}"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = str(log_dir / f"rank{rank}.log")
    # As in the self-spawned ranks, DeepSpeed's chatter goes to the rank's log; rank 0 keeps the
    # console for progress and the summary.
    console = os.fdopen(os.dup(1), "w", buffering=1)
    log = send_output_to(log_path)
    faulthandler.enable(file=log, all_threads=True)
    if rank == 0:
        # torchrun answers a dead rank with SIGTERM to the others; rank 0 takes it on a thread of
        # its own (the main thread may sit in a collective), so the mask is set before any thread starts.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    prepare_process(device)

    import torch.distributed as dist

    from parity.observe import collectives
    from parity.mutation.catalog import apply_named
    from parity.harness.placement import place_rank, use_placement
    from parity.subjects.base import RankContext

    # GPUs are a node's: NCCL with one rank per local GPU when the node has enough, else cuda:0 shared.
    placement = place_rank(env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], device)
    use_placement(placement)
    mode = f"{placement.mode}; launched by torchrun on {os.environ.get('GROUP_WORLD_SIZE', '?')} node(s)"
    collectives.install(trace=settings.trace_collectives)  # before DeepSpeed binds torch.distributed's collectives (see rank_worker)
    from parity.harness import group_cache

    group_cache.install()  # one group per membership for the process's life (see rank_worker)
    store, _, _ = next(dist.rendezvous("env://"))
    dist.init_process_group(placement.backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=CASE_COLLECTIVE_TIMEOUT_S))
    cases_store = dist.PrefixStore("parity", store)
    ctx = RankContext(rank=rank, world_size=world_size, device=placement.device, mode=mode)
    apply_named(settings.mutant, "rank")
    if rank == 0:
        coordinator = Coordinator(args, cases_store, ctx, device, log_path, console, settings)
        try:
            return coordinator.run()
        except SelectionError as exc:  # bad input found by the shared selection code, e.g. an unknown --case
            coordinator.say(f"parity: {exc}")
            return 2
        except BaseException:  # noqa: BLE001 - the console, not the rank log, must show it
            coordinator.say(f"parity: the coordinator (rank 0) failed:\n{traceback.format_exc()}")
            return 2

    seq = 0
    while True:
        seq += 1
        cases_store.wait([f"task/{seq}"], timedelta(seconds=NEXT_CASE_TIMEOUT_S))
        task = pickle.loads(cases_store.get(f"task/{seq}"))
        if task is None:
            break
        run_watched(cases_store, seq, task[0], task[1], ctx, args.timeout, log_path)
    dist.destroy_process_group()
    return 0


# -- rank 0 ------------------------------------------------------------------------------------------

class Coordinator:
    def __init__(self, args, store, ctx, device: str, log_path: str, console, settings):
        from parity.checks.compare import ReferenceCache

        self.args, self.store, self.ctx, self.device = args, store, ctx, device
        self.log_path, self.console = log_path, console
        self.settings = settings
        self.strict = settings.strict
        self.references = ReferenceCache.from_settings(settings)  # the cases' shared reference pairs
        self.verdicts, self.not_run = [], []
        # The main thread and an abort (watchdog or SIGTERM) record verdicts; abort records under it.
        self.lock = threading.RLock()
        self.current = None  # (seq, case, started) while the ranks run a case
        self.pending = []  # cases not yet recorded, in order
        self.start = time.monotonic()
        self.seq = 0
        self.main_thread = threading.get_ident()
        self.broken = False  # the case just run left a rank stuck or dead

    def say(self, text: str) -> None:
        print(text, file=self.console, flush=True)

    def select(self) -> list:
        from parity.matrix.cases import at_seeds, load, seed_list, select

        world_size = self.ctx.world_size
        runnable = []
        chosen = select(load(self.args.matrix), self.args.k, self.args.case, self.args.device,
                        getattr(self.args, "framework", None))
        seeds = seed_list(getattr(self.args, "seed", None), getattr(self.args, "seeds", None))
        for case in chosen if seeds is None else at_seeds(chosen, seeds):
            if case.values.optional("device", "cpu") != self.device:
                why = f"needs --device {case.values.optional('device', 'cpu')} (this launch runs {self.device} ranks)"
            elif case.world_size != world_size:
                why = (f"needs world {case.world_size} (this launch has {world_size} ranks): launch {case.world_size} "
                       f"processes in all, e.g. torchrun --nproc-per-node {case.world_size}")
            else:
                runnable.append(case)
                continue
            self.not_run.append({"id": case.id, "reason": why})
        return runnable

    def run(self) -> int:
        from parity.report.console import Progress
        from parity.harness.runner import timed_verdict

        threading.Thread(target=self._on_sigterm, daemon=True, name="parity-sigterm").start()
        try:
            cases = self.select()
        except BaseException:
            self.store.set("task/1", pickle.dumps(None))
            raise
        if not cases:
            self.store.set("task/1", pickle.dumps(None))
            if not self.not_run:
                self.say("parity: no cases selected")
                return 2
            self.finish()
            self.say(f"parity: none of the selected cases runs on {self.ctx.world_size} ranks")
            return 2
        self.pending = list(cases)
        self.progress = Progress(len(cases), stream=self.console)
        self.say(f"running {len(cases)} cases on {self.ctx.world_size} torchrun ranks ({self.ctx.mode})"
                 + (" (strict: skips fail)" if self.strict else "") + f"; rank logs: {Path(self.log_path).parent}")
        for case in cases:
            self.broken = False
            verdict = timed_verdict(case, lambda case=case: self._case(case), self.settings)
            self._record(verdict)
            if self.broken:
                return self._stop(f"the process group broke during {case.id} (a rank hung or died)")
        self.store.set(f"task/{self.seq + 1}", pickle.dumps(None))
        return self.finish()

    def _case(self, case):
        from parity.harness.runner import judge, skip_verdict

        skipped = skip_verdict(case, self.strict)
        if skipped:
            return skipped
        self.seq += 1
        started = time.monotonic()
        self.current = (self.seq, case, started)
        self.store.set(f"task/{self.seq}", pickle.dumps((case.subject, case.values)))
        run_watched(self.store, self.seq, case.subject, case.values, self.ctx, self.args.timeout, self.log_path,
                    on_lost=lambda: self.abort("rank 0 itself is stuck in this case"))
        outcome = collect(self.store, self.seq, self.ctx.world_size, started + self.args.timeout + REPORT_MARGIN_S,
                          f"no result within {self.args.timeout:.0f} s and no stack posted (the rank died, or its "
                          "process is frozen; see its log on its node)")
        self.broken = outcome.broken
        return judge(case, outcome, self.strict, self.ctx.mode, references=self.references)

    def _record(self, verdict) -> None:
        with self.lock:
            self.current = None
            self.pending.remove(verdict.case)
            self.verdicts.append(verdict)
            self.progress.update(verdict)

    def _on_sigterm(self) -> None:
        signal.sigwait({signal.SIGTERM})
        self.abort("torchrun stopped the launch (SIGTERM) because a rank process exited; torchrun's own error "
                   "output names it and its exit code")

    def abort(self, why: str) -> None:
        """From a watchdog or the SIGTERM thread while the main thread may be stuck: report, then exit."""
        from parity.harness.runner import judge, timed_verdict

        with self.lock:
            if self.current is not None:
                seq, case, started = self.current
                missing = f"no result: {why}"
                post_result(self.store, seq, 0, lost_result(0, self.main_thread, f"still running when {why}",
                                                            self.log_path))

                def produce():
                    outcome = collect(self.store, seq, self.ctx.world_size, time.monotonic() + REPORT_MARGIN_S, missing)
                    outcome.broken = True
                    return judge(case, outcome, self.strict, self.ctx.mode, references=self.references)

                verdict = timed_verdict(case, produce, self.settings)
                verdict.seconds = time.monotonic() - started
                self._record(verdict)
            code = self._stop(why)
        self.console.flush()
        os._exit(code)

    def _stop(self, why: str) -> int:
        self.not_run.extend({"id": c.id, "reason": f"not run: {why}; torchrun cannot replace a rank inside one "
                                                   "job, rerun these"} for c in self.pending)
        self.pending = []
        self.finish()
        return 1  # the ranks still running cases are stopped by torchrun when rank 0 exits

    def finish(self) -> int:
        from parity.report.console import summary_table, write_report

        wall = time.monotonic() - self.start
        self.say(summary_table(self.verdicts, wall, self.not_run))
        if self.args.report:
            write_report(self.args.report, [v.as_dict() for v in self.verdicts], wall, not_run=self.not_run,
                         launcher="torchrun")
            self.say(f"wrote {self.args.report}/summary.json, results.jsonl, summary.md, report.html")
        failed = any(v.status == "failed" for v in self.verdicts)
        return 1 if failed or (self.strict and self.not_run) else 0
