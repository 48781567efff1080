#!/usr/bin/env bash
# Round 10 on the H200 host's 16 CPU cores, sent with the `device` tool (carry [".whl"]):
#   bash results/perf/h200-16-cores-r10/run.sh OUT LABEL 'K-EXPRESSION'
# The 8x target's ratio on one tree, one case set and one machine: `parity run --baseline` (the harness
# as issue 16 found it: one case at a time, spawned ranks, no reference cache) on the cases -k selects,
# then the whole default CPU matrix with today's harness, both as the README's main job runs them (no
# --report). The baseline of the whole matrix does not fit one 600 s call: two calls take its two
# halves, 'EXPR' and 'not (EXPR)', and their walls add up.
set -u
out=$1; label=$2; expr=$3
source "$(dirname "$0")/../device_env.sh"
python3 ci/bench_pair.py --label "$label" --runs 1 --warmup 0 --log "$out/$label.log" \
  --a "python3 -m parity.cli run --device cpu --baseline -k '$expr'" \
  --b "python3 -m parity.cli run --device cpu" > "$out/bench_pair-$label.txt" 2>&1
gzip -f "$out/$label.log"
