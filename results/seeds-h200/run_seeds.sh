#!/usr/bin/env bash
# The commands of this folder's runs, as sent to the H200 machine with the `device` tool (carry [".whl"]).
# Usage, from the repo root there: bash results/seeds-h200/run_seeds.sh OUT LIMIT_S SEED:CPUS [SEED:CPUS ...]
# Each SEED runs the default CPU matrix (`parity run --device cpu --seed SEED`) pinned to CPUS (taskset -c),
# all seeds side by side; parity's default -j follows the pinned cores (os.sched_getaffinity), ranks use one
# thread each, so verdicts do not depend on the pinning. Each pass ends after LIMIT_S (timeout).
# PARITY_ARGS (optional) narrows every pass, e.g. PARITY_ARGS='-k "tied or embedding"'.
set -u
out=$1; limit=$2; shift 2
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket"; free -g | head -2; nproc
  python3 -c "import sys,torch,numpy,triton,deepspeed,transformers,liger_kernel,pydantic,huggingface_hub as h; from importlib.metadata import version as v; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'triton', triton.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'huggingface_hub', h.__version__, 'megatron-core', v('megatron-core'), 'liger-kernel', v('liger-kernel'), 'pydantic', pydantic.__version__, 'oneDNN fp16', torch.backends.mkldnn.is_available())"
} > "$out/env.txt" 2>&1
for spec in "$@"; do
  s=${spec%%:*}; cpus=${spec#*:}
  ( t0=$(date +%s)
    timeout "$limit" taskset -c "$cpus" bash -c "python3 -m parity.cli run --device cpu --seed $s --report /tmp/r$s ${PARITY_ARGS:-}" > "/tmp/s$s.log" 2>&1
    echo "seed $s cpus $cpus rc $? wall_s $(( $(date +%s) - t0 ))" >> "$out/env.txt" ) &
done
wait
for spec in "$@"; do
  s=${spec%%:*}; d=/tmp/pack$s; mkdir -p "$d"
  cp /tmp/r$s/summary.json /tmp/r$s/summary.md "$d/" 2>/dev/null
  cp "/tmp/s$s.log" "$d/run.log"
  # every failed check of every case whose verdict is failed or xpassed (results.jsonl rows)
  python3 - "$s" > "$d/failed_checks.jsonl" <<'PY' 2>> "$d/run.log"
import json, sys
s = sys.argv[1]
try:
    f = open(f"/tmp/r{s}/results.jsonl")
except OSError:
    sys.exit(0)
for line in f:
    r = json.loads(line)
    if r.get("verdict") in ("failed", "xpassed") and r.get("passed") is False:
        print(json.dumps(r))
PY
  tar czf "$out/s$s.tgz" -C "$d" .
done
ls -la "$out"
