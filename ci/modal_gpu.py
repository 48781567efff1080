"""GPU job on Modal: installs this tree and runs the cuda matrix in strict mode, then pytest -m gpu.

    modal run ci/modal_gpu.py                 # writes results/modal/summary.json locally

Strict mode makes a skipped case, or a Liger case that fell back to torch, fail the job: a GPU
job must not pass by skipping. Two GPUs give NCCL mode (one rank per GPU) for 2-rank cases; the
4-rank cases share a GPU over gloo. Not run from this repository's CI (no GPU, no Modal account):
the recorded GPU results under results/ come from ci/gpu_run.sh on the workplace's H200s.
"""
import json
from pathlib import Path

import modal

ROOT = Path(__file__).resolve().parents[1]

image = (
    modal.Image.from_registry("pytorch/pytorch:2.9.1-cuda12.8-cudnn9-devel", add_python="3.11")
    # The base image's torch is kept: -e '.[liger]' only adds what is missing.
    .add_local_dir(ROOT, remote_path="/repo", copy=True, ignore=[".venv", ".git", "**/__pycache__"])
    .run_commands("cd /repo && pip install -e '.[liger]'")
)
app = modal.App("tp-parity-gpu", image=image)


@app.function(gpu="H100:2", timeout=60 * 60)
def gpu_matrix() -> str:
    import subprocess

    env = {"PARITY_STRICT": "1", "PYTHONUNBUFFERED": "1", "PATH": "/usr/local/bin:/usr/bin:/bin",
           "NCCL_NVLS_ENABLE": "0"}
    subprocess.run(["parity", "run", "--device", "cuda", "--strict", "--report", "/tmp/report"], cwd="/repo",
                   check=True, env=env)
    subprocess.run(["python", "-m", "pytest", "-m", "gpu", "-q"], cwd="/repo", check=True, env=env)
    return Path("/tmp/report/summary.json").read_text()


@app.local_entrypoint()
def main():
    summary = gpu_matrix.remote()
    out = ROOT / "results" / "modal"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(summary)
    print(json.loads(summary)["counts"])
