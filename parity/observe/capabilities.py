"""What this machine can do, probed once per process and never by asking a subject under test.

A case names the capabilities it needs (``Subject.requires``); when one is missing the case is a
skip that names it, and a failure under strict mode. Each probe asks the layer *below* the subject
(torch, the hardware), so a subject that breaks can never make its own cases disappear: if DeepSpeed
refused fp16 on a CPU whose oneDNN supports it, the fp16 cases would run and fail, as they should.

PARITY_ASSUME_MISSING (comma-separated capability names) makes a probe report "missing" whatever
the machine has: the self-tests use it to show what a CPU without fp16 support does to a run.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

ASSUME_MISSING_VAR = "PARITY_ASSUME_MISSING"


def _cuda() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "a CUDA device; none is visible"


def _cpu_fp16() -> str | None:
    # DeepSpeed's CPU accelerator offers fp16 exactly when oneDNN reports it
    # (accelerator/cpu_accelerator.py, is_fp16_supported); oneDNN needs AVX-512 FP16 or AMX-FP16.
    # Most CPUs, GitHub's hosted runners and AMD EPYC among them, have neither.
    import torch

    try:
        supported = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError) as exc:
        return f"fp16 on this CPU (oneDNN fp16 could not be queried: {exc})"
    if supported:
        return None
    return ("fp16 on this CPU: oneDNN reports no fp16 support (no AVX-512 FP16 / AMX-FP16), so DeepSpeed's "
            "CPU accelerator refuses fp16")


def _triton_interpreter() -> str | None:
    # Liger's kernels run on CPU through Triton's interpreter. A kernel of the suite's own, in a child
    # process (TRITON_INTERPRET must be set before triton is imported, and a crash must not take this
    # process along), asks whether that works with the installed triton and numpy, without Liger.
    if find_spec("triton") is None:
        return "triton_interpreter: triton is not installed"
    probe = Path(__file__).with_name("triton_probe.py")
    try:
        proc = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TRITON_INTERPRET": "1"})
    except subprocess.TimeoutExpired:
        return f"triton_interpreter: {probe.name} did not finish in 300 s"
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return (f"triton_interpreter: Triton's interpreter fails the suite's probe kernel with "
            f"{_versions('triton', 'numpy')}: {lines[-1] if lines else f'exit status {proc.returncode}'}")


def _versions(*names) -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def _megatron_core() -> str | None:
    # megatron-core is an optional extra (pip install -e .[megatron]); its import pulls optional CUDA
    # pieces (transformer_engine, apex) only when present. Imported in a child process, as the ranks
    # import it, so a broken install names itself here instead of crashing a rank or the parent.
    if find_spec("megatron") is None or find_spec("megatron.core") is None:
        return "megatron_core: megatron-core is not installed (pip install -e .[megatron])"
    code = ("import warnings; warnings.simplefilter('ignore'); "
            "from megatron.core import parallel_state, tensor_parallel; "
            "tensor_parallel.ColumnParallelLinear, tensor_parallel.VocabParallelEmbedding, "
            "tensor_parallel.vocab_parallel_cross_entropy")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "megatron_core: importing megatron.core.tensor_parallel did not finish in 300 s"
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return (f"megatron_core: importing megatron.core.tensor_parallel fails with {_versions('megatron-core', 'torch')}: "
            f"{lines[-1] if lines else f'exit status {proc.returncode}'}")


def _cpp_toolchain() -> str | None:
    # DeepSpeed JIT-builds its CPU shm all-reduce op (op_builder/cpu/comm.py, ShareMemCommBuilder) through torch's
    # cpp_extension, which needs ninja and the C++ compiler it names (CXX, else c++).
    import shutil

    from torch.utils.cpp_extension import is_ninja_available

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"cpp_toolchain: a C++ compiler ({compiler}) to JIT-build DeepSpeed's CPU shm op; none on PATH"
    if not is_ninja_available():
        return "cpp_toolchain: ninja to JIT-build DeepSpeed's CPU shm op (pip install ninja)"
    return None


@functools.cache  # asked by each claims() of an shm case; a process never changes CPU
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags as Linux lists them (empty where /proc/cpuinfo is not there)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def _gpus(count: int):
    # One rank per GPU over NCCL. Ranks sharing one GPU run over gloo, and ProcessGroupGloo's all-gather
    # into a tensor crashes the process on CUDA tensors (SIGSEGV in gloo::allgather, pytorch/pytorch#152645;
    # seen on the H200 with torch 2.11), so a CUDA case whose plan all-gathers needs a GPU per rank.
    def probe() -> str | None:
        import torch

        found = torch.cuda.device_count()
        if found >= count:
            return None
        return (f"gpus{count}: one GPU per rank ({count}) for NCCL; {found} visible, and ranks sharing a GPU over "
                f"gloo crash in its CUDA all-gather (pytorch/pytorch#152645)")
    return probe


PROBES = {
    "cuda": _cuda,
    "cpu_fp16": _cpu_fp16,
    "triton_interpreter": _triton_interpreter,
    "megatron_core": _megatron_core,
    "cpp_toolchain": _cpp_toolchain,
    **{f"gpus{n}": _gpus(n) for n in (2, 3, 4, 8)},
}


def _assumed_missing() -> set[str]:
    names = {n.strip() for n in os.environ.get(ASSUME_MISSING_VAR, "").split(",") if n.strip()}
    unknown = names - set(PROBES)
    if unknown:
        raise ValueError(f"{ASSUME_MISSING_VAR}: unknown capability {sorted(unknown)[0]!r} "
                         f"(allowed: {', '.join(PROBES)})")
    return names


# Answers another process already probed (parity run -j hands its job processes the parent's).
_preset: dict = {}


def preset(answers: dict) -> None:
    """Take these answers (name -> None or why missing) instead of probing again."""
    _preset.update(answers)


@functools.cache
def _probe(name: str) -> str | None:
    if name in _preset:
        return _preset[name]
    return PROBES[name]()


def missing(name: str) -> str | None:
    """None when this machine has the capability; otherwise what is missing, as a skip reason reads it."""
    if name in _assumed_missing():
        return f"{name} (simulated missing by {ASSUME_MISSING_VAR})"
    return _probe(name)


def unavailable_reason(names) -> str | None:
    for name in names:
        why = missing(name)
        if why:
            return f"needs {why}"
    return None


def snapshot() -> dict:
    """Every capability as this run sees it, for reports: name -> None (present) or why it is missing."""
    return {name: missing(name) for name in PROBES}


def facts() -> dict:
    """What the machine has that decides no case by itself, for reports (and for placement to read)."""
    import torch

    return {"gpu_count": torch.cuda.device_count()}
