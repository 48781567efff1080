#!/usr/bin/env bash
# Round 8 A/B on the device (carry [".whl"]): A = per-job forkservers (PARITY_EXP_OLD=1), B = one run forkserver.
set -u
out=$1; label=ab
source "$(dirname "$0")/../device_env.sh"
python3 ci/bench_pair.py --label "matrix-r8" --runs ${RUNS:-1} --warmup 0 --log "$out/ab.log" \
  --a "env PARITY_EXP_OLD=1 python3 -m parity.cli run --device cpu --profile --report /tmp/rb-a" \
  --b "python3 -m parity.cli run --device cpu --profile --report /tmp/rb-b" > "$out/bench_pair-ab.txt" 2>&1
cp /tmp/rb-a/profile.md "$out/profile-a.md"; cp /tmp/rb-b/profile.md "$out/profile-b.md"; gzip -f "$out/ab.log"
cat "$out/bench_pair-ab.txt"
