"""One run's settings, built once where a run starts (`parity run` from its options and the
environment, the pytest face from the environment) and handed to whatever runs cases: the Runner,
the job processes of `parity run -j N`, and their rank processes.

The PARITY_* variables are the user's interface, read by RunSettings.from_env: PARITY_STRICT,
PARITY_CASES_DIR, PARITY_SUBJECT_MODULES, PARITY_MUTANT and PARITY_TRACE_COLLECTIVES. Two are read
elsewhere too: PARITY_SUBJECT_MODULES by the subject registry, which extends it for the ranks it
reaches by inheritance; PARITY_ASSUME_MISSING only by parity.observe.capabilities, when a capability
is asked for (that module imports nothing from parity, so no subject can decide its own skips).
This module imports nothing from the package.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

STRICT_VAR = "PARITY_STRICT"
CASES_DIR_VAR = "PARITY_CASES_DIR"
SUBJECT_MODULES_VAR = "PARITY_SUBJECT_MODULES"
MUTANT_VAR = "PARITY_MUTANT"
TRACE_COLLECTIVES_VAR = "PARITY_TRACE_COLLECTIVES"

# Reference pairs one process keeps in memory (parity.checks.compare.ReferenceCache); 0: none.
DEFAULT_REFERENCE_CACHE_SIZE = 256
DEFAULT_CASE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RunSettings:
    strict: bool = False  # a skip (or an xpass) is a failure
    timeout_s: float = DEFAULT_CASE_TIMEOUT_S  # seconds a case may take on its ranks
    jobs: int = 0  # job processes (parity run -j); 0: chosen from the cores and memory
    log_dir: str | None = None  # where rank logs go (None: a temp dir)
    reference_cache_size: int = DEFAULT_REFERENCE_CACHE_SIZE  # --no-reference-cache: 0
    reference_disk: str | None = None  # --reference-cache DIR: the cache's copy on disk
    cases_dir: str | None = None  # the default case files' directory (None: the checkout's cases/)
    subject_modules: tuple[str, ...] = ()  # modules whose SUBJECTS lists join the registry
    mutant: str = ""  # the planted bug of the mutation check, "" for none
    trace_collectives: bool = False  # ranks print each counted collective call's stack

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **fields) -> RunSettings:
        """The settings the PARITY_* variables of environ (default: this process's) give, with fields
        (command-line options) on top."""
        env = os.environ if environ is None else environ
        read = dict(strict=env.get(STRICT_VAR, "").lower() in ("1", "true", "yes"),
                    cases_dir=env.get(CASES_DIR_VAR) or None,
                    subject_modules=tuple(n for n in env.get(SUBJECT_MODULES_VAR, "").split(",") if n),
                    mutant=env.get(MUTANT_VAR, "").strip(),
                    trace_collectives=bool(env.get(TRACE_COLLECTIVES_VAR)))
        return cls(**{**read, **fields})

    def replace(self, **fields) -> RunSettings:
        return dataclasses.replace(self, **fields)

    def as_dict(self) -> dict:
        """Plain values, for a process started with them (RunSettings(**d) rebuilds it)."""
        return dataclasses.asdict(self)

    def rank_environ(self, environ: Mapping[str, str]) -> dict:
        """environ as a rank process of this run is given it: PARITY_MUTANT is this run's mutant
        (set, or removed when there is none); what a rank imports reads it at rank start."""
        env = {k: v for k, v in environ.items() if k != MUTANT_VAR}
        if self.mutant:
            env[MUTANT_VAR] = self.mutant
        return env

    def repro_env(self) -> dict:
        """The variables a reproducer of one of this run's cases must set, in the order it says them."""
        env = {}
        if self.subject_modules:
            env[SUBJECT_MODULES_VAR] = ",".join(self.subject_modules)
        if self.mutant:
            env[MUTANT_VAR] = self.mutant
        return env
