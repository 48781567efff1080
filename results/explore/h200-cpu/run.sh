#!/usr/bin/env bash
# parity explore on the H200 host's 16 CPU cores, as sent with the `device` tool (carry [".whl"]):
# one explore per seed, side by side (each draws rank groups of at most 4, so four fit the cores).
# Usage, from the repo root there: bash results/explore/h200-cpu/run.sh OUT BUDGET SEED...
# Everything lands in OUT/explore.tgz: the device tool brings back only a few files per call.
set -u
dest=$1; budget=$2; shift 2
out=/tmp/explore-out; rm -rf "$out"; mkdir -p "$out"
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)"; git log -1 --format=%H 2>/dev/null
  python3 -c "import sys,torch,numpy,deepspeed; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'deepspeed', deepspeed.__version__)"
} > "$out/env.txt" 2>&1
for seed in "$@"; do
  mkdir -p "$out/seed$seed"
  ( /usr/bin/time -v python3 -m parity.cli explore --budget "$budget" --seed "$seed" --report "$out/seed$seed" \
      > "$out/seed$seed/explore.log" 2> "$out/seed$seed/stderr.log"; echo "rc $?" >> "$out/seed$seed/explore.log" ) &
done
wait
for seed in "$@"; do tail -n 25 "$out/seed$seed/explore.log"; done
tar -czf "$dest/explore.tgz" -C "$out" .
