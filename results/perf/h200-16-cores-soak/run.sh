#!/usr/bin/env bash
# The memory soak of issue 16 on the whole default CPU matrix, on the H200 host's 16 CPU cores, sent with
# the `device` tool (carry [".whl"]):   bash results/perf/h200-16-cores-soak/run.sh OUT LABEL
# Five consecutive passes of the matrix in one `parity run` (today's harness, -j from the core count);
# after each pass it prints the parent's, every job's and every rank's RSS (parity/report/memory.py).
set -u
out=$1; label=$2
source "$(dirname "$0")/../device_env.sh"
python3 -m parity.cli run --device cpu --passes 5 > "$out/$label.log" 2>&1
echo "exit $?" >> "$out/$label.log"
grep -E "^running|^pass [0-9]|passed, .* failed|^exit" "$out/$label.log" > "$out/soak-$label.txt"
gzip -f "$out/$label.log"
