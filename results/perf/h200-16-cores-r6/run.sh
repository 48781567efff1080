#!/usr/bin/env bash
# Round 6 on the H200 host's 16 CPU cores, sent with the `device` tool (carry [".whl"]):
#   bash results/perf/h200-16-cores-r6/run.sh OUT LABEL [parity run options...]
# One `parity run --device cpu --profile` (default -j) through ci/bench_pair.py, its profile (with the
# jobs' occupancy) and log kept under OUT.
set -u
out=$1; label=$2; shift 2
source "$(dirname "$0")/../device_env.sh"
python3 ci/bench_pair.py --label "matrix-$label" --runs 1 --warmup 0 --log "$out/$label.log" --a "true" \
  --b "python3 -m parity.cli run --device cpu --profile --report /tmp/rb-$label $*" > "$out/bench_pair-$label.txt" 2>&1
cp "/tmp/rb-$label/profile.md" "$out/profile-$label.md"; gzip -c "$out/$label.log" > "$out/$label.log.gz"; rm "$out/$label.log"
