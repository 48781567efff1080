#!/usr/bin/env bash
# The commands of this folder's runs, as sent to the H200 machine with the `device` tool (carry [".whl"]).
# Usage, from the repo root there: bash results/perf/h200-16-cores-r3/run.sh OUT new|baseline
# new: parity run --device cpu (default -j: 8 job processes on 16 cores); baseline: parity run --baseline.
# Each through ci/bench_pair.py (wall from a monotonic clock; CPU and peak RSS from wait4, which does not
# see forked ranks: their forkserver is not waited for, so B's CPU counts the parent and its jobs only).
set -u
out=$1; which=$2
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)"; nproc; git log -1 --format=%H 2>/dev/null
  python3 -c "import sys,torch,numpy,triton,deepspeed; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'triton', triton.__version__, 'deepspeed', deepspeed.__version__)"
} > "$out/env-$which.txt" 2>&1
if [ "$which" = new ]; then
  python3 ci/bench_pair.py --label matrix-new --runs 1 --warmup 0 --log "$out/new.log" --a "true" \
    --b "python3 -m parity.cli run --device cpu --profile --report /tmp/rb" > "$out/bench_pair-new.txt" 2>&1
  cp /tmp/rb/profile.md "$out/profile-new.md"; gzip -c "$out/new.log" > "$out/new.log.gz"; rm "$out/new.log"
else
  python3 ci/bench_pair.py --label matrix-baseline --runs 1 --warmup 0 --log "$out/baseline.log" \
    --a "python3 -m parity.cli run --baseline --device cpu" --b "true" > "$out/bench_pair-baseline.txt" 2>&1
  gzip -c "$out/baseline.log" > "$out/baseline.log.gz"; rm "$out/baseline.log"
fi
