#!/usr/bin/env bash
# Third device call: the default CPU matrix at seed 0 (pinned to cores 0-11) and, beside it on cores 12-15,
# every case that failed or xpassed at seeds 1-4, at seeds 0-4 (results/seeds-h200/recheck_ids.txt), on one tree.
# Usage, from the repo root there: bash results/seeds-h200/recheck.sh OUT LIMIT_S
set -u
out=$1; limit=$2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
args=(); while read -r id; do [ -n "$id" ] && args+=(--case "$id"); done < results/seeds-h200/recheck_ids.txt
( t0=$(date +%s); timeout "$limit" taskset -c 12-15 python3 -m parity.cli run --device cpu "${args[@]}" --report /tmp/rre > /tmp/re.log 2>&1
  echo "recheck rc $? wall_s $(( $(date +%s) - t0 ))" >> "$out/env.txt" ) &
bash results/seeds-h200/run_seeds.sh "$out" "$limit" 0:0-11 >/dev/null
wait
d=/tmp/packre; mkdir -p $d; cp /tmp/rre/summary.json /tmp/rre/summary.md $d/ 2>/dev/null; cp /tmp/re.log $d/run.log
python3 -c "
import json
for l in open('/tmp/rre/results.jsonl'):
    r=json.loads(l)
    if r.get('passed') is False: print(json.dumps(r))" > $d/failed_checks.jsonl 2>>$d/run.log
tar czf "$out/recheck.tgz" -C $d .
ls -la "$out"
