#!/usr/bin/env bash
# Issue 16's memory soak again, after each job got its share of the reference LRU (5325bea) and the
# parent dropped the last pass's verdicts (f2e8419): the H200 host's 16 CPU cores, the device tool,
# carry [".whl"].
#   bash results/perf/h200-16-cores-soak-r2/run.sh OUT soak   five passes of the default CPU matrix in one
#       `parity run --profile` (jobs from the core count); the parent's, every job's and every rank's RSS
#       after each pass; the profile's reference-cache counts are the five passes' sums
#   bash results/perf/h200-16-cores-soak-r2/run.sh OUT hits   one pass with --profile, today's code, then
#       the same with every job holding the whole 256-pair bound (the code before 5325bea, made by
#       editing a copy): what the share costs in reference-cache hits
set -u
out=$1; label=$2
source "$(dirname "$0")/../device_env.sh"
if [ "$label" = soak ]; then
    python3 -m parity.cli run --device cpu --passes 5 --profile > "$out/$label.log" 2>&1
    echo "exit $?" >> "$out/$label.log"
    grep -E "^running|^pass [0-9]|passed, .* failed|^Reference cache|^exit" "$out/$label.log" > "$out/soak-$label.txt"
    gzip -f "$out/$label.log"
else
    rm -rf /tmp/whole && mkdir /tmp/whole && cp -r $(ls -A | grep -vx .whl) /tmp/whole/  # the repo less the wheels
    sed -i 's/"reference_cache_size": job_cache_size(compare.REFERENCE_CACHE_SIZE, jobs)/"reference_cache_size": compare.REFERENCE_CACHE_SIZE/' /tmp/whole/parity/harness/job_processes.py
    grep -c '"reference_cache_size": compare.REFERENCE_CACHE_SIZE' /tmp/whole/parity/harness/job_processes.py > "$out/hits-edit.txt"
    for side in share whole; do
        dir=$PWD; [ $side = whole ] && dir=/tmp/whole
        (cd "$dir" && PYTHONPATH=/tmp/site:$dir python3 -m parity.cli run --device cpu --profile > "$out/hits-$side.log" 2>&1; echo "exit $?" >> "$out/hits-$side.log")
        grep -E "^running|passed, .* failed|^Reference cache|^exit" "$out/hits-$side.log" > "$out/hits-$side.txt"
        gzip -f "$out/hits-$side.log"
    done
fi
