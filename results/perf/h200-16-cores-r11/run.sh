#!/usr/bin/env bash
# Round 11 on the H200 host's 16 CPU cores, sent with the `device` tool (carry [".whl"]):
#   bash results/perf/h200-16-cores-r11/run.sh OUT LABEL 'K-EXPRESSION' [with-today]
# Round 10's whole-matrix baseline did not fit one 600 s call and its second half was killed unfinished.
# Here the default CPU matrix is cut into five disjoint -k parts (parts.txt; `parity list -k` on the VM
# shows they add up to the whole matrix), each part's `parity run --baseline` is timed in its own call,
# and the walls add up. With `with-today`, the same call also times today's `parity run` on the whole
# matrix as the pair's B; otherwise B is `true` (its wall and the printed ratio mean nothing there).
set -u
out=$1; label=$2; expr=$3; today=${4:-}
source "$(dirname "$0")/../device_env.sh"
b=true
[ "$today" = with-today ] && b="python3 -m parity.cli run --device cpu"
python3 ci/bench_pair.py --label "$label" --runs 1 --warmup 0 --log "$out/$label.log" \
  --a "python3 -m parity.cli run --device cpu --baseline -k '$expr'" \
  --b "$b" > "$out/bench_pair-$label.txt" 2>&1
gzip -f "$out/$label.log"
