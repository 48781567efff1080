"""One str-hash seed for every process that computes references: PYTHONHASHSEED pinned (0 unless set).

Python salts str hashes per process, so a set of strings iterates in a per-process order, and a model
forward that loops over one (transformers' Gemma3TextModel.forward: ``for layer_type in
set(self.config.layer_types)``) runs its independent computations in that order. Their values do not
move, but the rounding samples (parity/checks/rounding.py) draw their noise from one seeded stream in op
order, so the draws change hands and the sampled bounds changed from process to process. The salt is
fixed at interpreter start: an entry point that finds it unpinned starts itself again with it pinned.
No torch here: the entry points call this before their imports.
"""
from __future__ import annotations

import os
import sys

HASH_SEED = "0"


def pinned() -> bool:
    """PYTHONHASHSEED is a fixed seed (an explicit one other than 0 is honoured: it is as reproducible)."""
    return os.environ.get("PYTHONHASHSEED", "").isdigit()


def restart_pinned() -> None:
    """Replace this process by the same command line with PYTHONHASHSEED=0, unless it is pinned already
    (then return). Only for a process's own command line: ``sys.orig_argv`` is run again."""
    if pinned():
        return
    os.environ["PYTHONHASHSEED"] = HASH_SEED
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
