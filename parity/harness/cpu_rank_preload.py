"""The frameworks a CPU rank's forkserver imports once, so that every rank forked from it has them.

Importing DeepSpeed, transformers (with its lazily indexed model registry, which DeepSpeed's AutoTP
walks) and megatron.core costs a rank about 2.4 CPU seconds on the 2-core EPYC (0.4, 1.0, 0.5, 0.5),
once per rank process, and every torn-down group starts new ones. Forked from a forkserver that
already imported them, a rank shares those pages instead.

What a rank does not share by that: the process group, the accelerator's devices, anything keyed by
RANK or WORLD_SIZE. DeepSpeed 0.19.8 reads one environment variable at import (DEEPSPEED_TIMEOUT,
the same in the forkserver as in the parent that started it) and picks its accelerator from
DS_ACCELERATOR, which the CPU forkserver has set as a CPU rank does (rank_worker.CPU_RANK_ENV); its
logger's handler keeps the forkserver's sys.stdout, whose descriptor a rank points at its own log
(rank_worker.send_output_to), and flushes every record. Nothing starts a thread. The default CPU
matrix gave the same results.jsonl, byte for byte, with and without this preload (2149 cases,
collective counts included).

A framework that is absent or fails to import is left to the ranks that need it: they import it
themselves and report the error as their own, with its traceback. What the imports warn (Megatron
without Transformer Engine, ...) is kept and written to each rank's log (replay_warnings), where a
rank importing them itself would have written it, not to the terminal of whoever ran parity.
"""
from __future__ import annotations

import importlib
import warnings

FRAMEWORKS = ("deepspeed", "transformers", "transformers.models", "megatron.core")

_warned: list[str] = []
with warnings.catch_warnings(record=True) as _caught:  # under the process's filters, as a rank's own import
    for _name in FRAMEWORKS:
        try:
            importlib.import_module(_name)
        except Exception:  # noqa: BLE001 - see the docstring: the rank that needs it reports it
            pass
    _warned.extend(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in _caught)


def replay_warnings(stream) -> None:
    """Write what the preload's imports warned to stream (a rank's log)."""
    for text in _warned:
        stream.write(text)
