#!/usr/bin/env bash
# Create .venv and install the suite with the exact CPU pins. Idempotent; about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-cpu.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
.venv/bin/python -c "import deepspeed, liger_kernel, torch, transformers; from importlib.metadata import version; print('installed: torch', torch.__version__, '| deepspeed', deepspeed.__version__, '| transformers', transformers.__version__, '| megatron-core', version('megatron-core'))"
