#!/usr/bin/env bash
# `parity sensitivity` over selection.txt on the H200 host's CPUs (device tool, carry [".whl"]): the ids are
# dealt round-robin to GROUPS processes side by side (each measures its cases one at a time, as
# `parity sensitivity` does), then merged into one sensitivity.json / sensitivity.md by
# `python results/sensitivity/full/merge.py OUT/g*/sensitivity.json`.
# Usage, from the repo root there: bash results/sensitivity/full/run_on_device.sh OUT GROUPS LIMIT_S [SELECTION]
# (the first call measured selection.txt in 8 groups, of which 4 ran past 560 s; the second measured
# those 16 cases, selection-second-call.txt, one per group). The groups' own files come back as OUT/groups.tgz.
set -u
out=$1; groups=$2; limit=$3; selection=${4:-results/sensitivity/full/selection.txt}
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)"; python3 -c "import sys,torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'oneDNN fp16', torch.ops.mkldnn._is_mkldnn_fp16_supported())"; } > "$out/env.txt" 2>&1
for g in $(seq 0 $((groups - 1))); do
  args=$(awk -v g="$g" -v n="$groups" 'NF && (NR - 1) % n == g { printf " --case %s", $1 }' "$selection")
  mkdir -p "$out/g$g"
  ( timeout "$limit" python3 -m parity.cli sensitivity $args --report "$out/g$g" > "$out/g$g/log.txt" 2>&1
    echo "group $g rc $?" >> "$out/env.txt" ) &
done
wait
python3 results/sensitivity/full/merge.py $(ls "$out"/g*/sensitivity.json) --report "$out"
tar czf "$out/groups.tgz" -C "$out" $(cd "$out" && ls -d g*) && rm -rf "$out"/g*/
