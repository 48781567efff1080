"""The reference cache's copy on disk (parity run --reference-cache DIR): one file per computed reference pair,
named by a hash of everything the pair depends on, written atomically and loaded with weights_only
(docs/speed.md, --reference-cache)."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import tempfile
import threading
from pathlib import Path

import torch

import references
from references.trajectory import Trajectory

FORMAT = 2  # 2: references computed on one torch thread (parity/checks/one_thread.py)


def source_fingerprint(package_dir: Path) -> str:
    """sha256 over the path and bytes of every .py file under package_dir, in path order."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


class ReferenceDisk:
    """Reference pairs under `directory`, keyed by content; references_dir: whose source is hashed
    into every key (the references package itself unless a test says otherwise)."""

    def __init__(self, directory, references_dir: Path | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.salt = "\n".join([f"format {FORMAT}",
                               f"references {source_fingerprint(references_dir or Path(references.__file__).parent)}",
                               f"torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()}"])
        self.stats = {"disk_hits": 0, "disk_writes": 0, "disk_unreadable": 0}
        self._lock = threading.Lock()  # a Runner's reference thread and its caller's may both use it

    def _count(self, name: str) -> None:
        with self._lock:
            self.stats[name] += 1

    def _entry(self, reference_key) -> tuple[str, Path]:
        # repr of the key: frozen dataclasses and plain values, every field spelled out.
        text = f"{self.salt}\n{reference_key!r}"
        return text, self.directory / f"{hashlib.sha256(text.encode()).hexdigest()}.pt"

    def load(self, reference_key) -> tuple[Trajectory, Trajectory] | None:
        """The stored pair, or None: not stored, or unreadable (counted, said on stderr, and to be
        recomputed by the caller, whose save() replaces it)."""
        text, path = self._entry(reference_key)
        try:
            entry = torch.load(path, weights_only=True)
            if entry["key"] != text:
                raise ValueError("it holds another key")
            pair = tuple(Trajectory(**fields) for fields in entry["pair"])
            if len(pair) != 2:
                raise ValueError(f"{len(pair)} trajectories, not 2")
        except FileNotFoundError:
            return None
        except Exception as exc:  # a torn, truncated or foreign file is a miss, never a failed run
            self._count("disk_unreadable")
            print(f"reference cache: {path} is unreadable ({type(exc).__name__}: {exc}); computing it again",
                  file=sys.stderr, flush=True)
            return None
        self._count("disk_hits")
        return pair

    def save(self, reference_key, pair: tuple[Trajectory, Trajectory]) -> None:
        text, path = self._entry(reference_key)
        entry = {"key": text, "pair": [{f.name: getattr(t, f.name) for f in dataclasses.fields(Trajectory)}
                                       for t in pair]}
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{path.stem[:16]}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                torch.save(entry, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except OSError as exc:  # a full or read-only disk costs the copy, not the run
            print(f"reference cache: could not write {path} ({exc}); the run goes on without it",
                  file=sys.stderr, flush=True)
            return
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self._count("disk_writes")
