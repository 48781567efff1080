#!/usr/bin/env bash
# Big CPU runs on the device tool's GPU host (16 cores, Python 3.12, torch 2.11, no network; wheels in .whl/,
# see ci/gpu_run.sh and docs/gpu-and-ci.md): one `parity` command, interrupted with SIGINT after T seconds (the
# report then keeps the cases not run, named) so the call's time limit never loses the report.
# Usage on that host: T=500 bash ci/device_cpu_run.sh OUTDIR NAME PARITY-ARGS...   (several may run side by side)
set -u
out=${1:?usage: ci/device_cpu_run.sh OUTDIR NAME ARGS...}; name=${2:?name}; shift 2
mkdir -p "$out"
if mkdir /tmp/site.lock 2>/dev/null; then  # the first of several side by side installs; the others wait for it
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl >/dev/null 2>&1; touch /tmp/site.done
fi
while [ ! -e /tmp/site.done ]; do sleep 1; done
# No network there: the hub must never be asked (the zoo builds every model from its config class).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{ lscpu | grep -E "Model name|^CPU\(s\)"; python3 -c "import sys, torch, numpy, transformers, deepspeed
print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__,
      'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)"; } > "$out/env.txt" 2>&1
timeout -s INT "${T:-500}" python3 -m parity.cli "$@" --report "$out/$name" > "$out/$name.log" 2>&1
echo "rc $?" >> "$out/$name.log"
gzip -f "$out/$name/results.jsonl" 2>/dev/null || true
rm -f "$out/$name/report.html"
