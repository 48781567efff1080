#!/usr/bin/env bash
# The GPU job as it ran on the workplace's H200 machines (results/h200*/): no network there, so
# deepspeed, liger-kernel, pydantic and hjson travel as wheels in .whl/ (see docs/gpu-and-ci.md#gpu-runs):
#   DS_BUILD_OPS=0 pip wheel --no-deps --no-build-isolation deepspeed==0.19.8 -w .whl
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl liger-kernel==0.8.5 pydantic==2.14.4 pydantic-core==2.50.5 hjson==3.1.0 \
#       annotated-types==0.8.0 typing-inspection==0.4.5
# It records `parity run` and `parity bench`; the CI's pytest command for the cuda cases is
# `python ci/modal_runner.py --local` (on Modal: without --local), see ci/README.md.
# Usage on the GPU machine, from the repo root: bash ci/gpu_run.sh OUTDIR
set -euo pipefail
out=${1:?usage: ci/gpu_run.sh OUTDIR}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" >> "$out/env.txt"
python3 -m parity.cli run --device cuda --strict --report "$out/gpu" > "$out/gpu-run.log" 2>&1
timeout 420 python3 -m parity.cli bench --device cuda --repeats 20 --json "$out/bench-h200.json" --markdown "$out/bench-h200.md" > "$out/bench.log" 2>&1
# With 2+ GPUs: the seed's TP=2 setting over real NCCL collectives (results/h200-x2/).
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    timeout 420 python3 -m parity.cli bench --device cuda --tp 2 --repeats 20 --json "$out/bench-tp2.json" --markdown "$out/bench-tp2.md" > "$out/bench-tp2.log" 2>&1
fi
