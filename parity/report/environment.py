"""What a run tested and on what: the packages under test with where they were imported from, the
machine, and the suite itself, for summary.json (and `parity diff`, which says when two runs tested
different versions).

A package's version alone cannot tell a user's DeepSpeed checkout from the release it claims to be,
so each package records where Python finds it (without importing it) and, where that is a git tree
(an editable install, a PYTHONPATH checkout), its commit and whether it has uncommitted changes.
"""
from __future__ import annotations

import json
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, distribution
from importlib.util import find_spec
from pathlib import Path

# 2: environment.packages/machine/suite, capabilities, schema_version (1 was the unversioned format).
SCHEMA_VERSION = 2
# distribution name -> import name
PACKAGES = {"deepspeed": "deepspeed", "liger-kernel": "liger_kernel", "torch": "torch", "triton": "triton",
            "transformers": "transformers", "numpy": "numpy"}


def git_state(path) -> dict | None:
    """{"commit", "dirty"} of the git work tree holding path, or None outside one."""
    path = Path(path)
    where = path if path.is_dir() else path.parent
    try:
        top = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=30)
        if top.returncode != 0:
            return None
        root, commit = top.stdout.split()
        status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return {"commit": commit, "dirty": bool(status.stdout.strip())}


def _editable(dist) -> bool:
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except (json.JSONDecodeError, OSError):
        return False
    return bool(direct.get("dir_info", {}).get("editable"))


def package(dist_name: str, import_name: str) -> dict:
    """The installed distribution's version, and where the import system finds the package: the two
    differ when a checkout is put first on PYTHONPATH."""
    spec = find_spec(import_name)
    if spec is None:
        return {"version": None, "path": None}
    locations = list(spec.submodule_search_locations or []) or [spec.origin]
    path = str(Path(locations[0]).resolve())
    try:
        dist = distribution(dist_name)
        version, editable = dist.version, _editable(dist)
        installed_at = Path(dist.locate_file("")).resolve()
        from_dist = editable or Path(path).is_relative_to(installed_at)
    except PackageNotFoundError:
        version, editable, from_dist = None, False, False
    record = {"version": version, "path": path, "editable": editable, "from_installed_distribution": from_dist}
    # A release's files sit in site-packages, no git tree: only look for one where a user's tree may be.
    if editable or not from_dist:
        state = git_state(path)
        if state:
            record["git"] = state
    return record


def packages() -> dict:
    return {name: package(name, module) for name, module in PACKAGES.items()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    import torch

    info = {"cpu_model": _cpu_model(), "cpu_count": __import__("os").cpu_count(), "gpu_count": 0,
            "gpu_name": None, "cuda": torch.version.cuda, "nccl": None}
    if torch.cuda.is_available():
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu_name"] = torch.cuda.get_device_name(0)
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError, TypeError):
            info["nccl"] = None
    return info


def suite() -> dict:
    """The suite's own version: its git commit where it runs from a tree (None from a wheel)."""
    return {"git": git_state(Path(__file__).resolve().parents[2])}


def version_changes(a: dict, b: dict) -> list[str]:
    """One line per package tested at a different version or from a different place; a summary.json
    of schema 1 recorded none, which is said once instead."""
    pa, pb = (run.get("packages") or {} for run in (a, b))
    if not (pa and pb):
        missing = " and ".join(label for label, p in (("A", pa), ("B", pb)) if not p)
        return [f"package versions not recorded in {missing} (a report older than schema {SCHEMA_VERSION})"] \
            if pa or pb else []
    lines = []
    for name in sorted(set(pa) | set(pb)):
        old, new = pa.get(name) or {}, pb.get(name) or {}
        if old.get("version") != new.get("version"):
            lines.append(f"{name}: {old.get('version')} -> {new.get('version')}")
        if old.get("path") != new.get("path"):
            lines.append(f"{name}: imported from {old.get('path')} -> {new.get('path')}")
        if old.get("git") != new.get("git"):
            lines.append(f"{name}: git {_git(old.get('git'))} -> {_git(new.get('git'))}")
    return lines


def _git(state) -> str:
    if not state:
        return "none"
    return state["commit"][:12] + (" (dirty)" if state["dirty"] else "")
