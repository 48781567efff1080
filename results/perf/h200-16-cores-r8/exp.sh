#!/usr/bin/env bash
# Round 8 experiments (device tool, carry [".whl"]): bash results/perf/h200-16-cores-r8/exp.sh OUT
set -u
out=$1; label=exp
source "$(dirname "$0")/../device_env.sh"
one() {  # label, env..., -- parity args
  local l=$1; shift
  local t0=$(date +%s.%N)
  env "$@" python3 -m parity.cli run --device cpu --profile --report /tmp/rb-$l $PARITY_ARGS > "$out/$l.log" 2>&1
  local t1=$(date +%s.%N)
  echo "$l start $t0 end $t1 wall $(python3 -c "print(round($t1-$t0,2))") pool $(grep -o 'pool created at [0-9.]*' $out/$l.log | head -1) $(grep -E 'passed.*failed' $out/$l.log | tail -1)" | tee -a "$out/summary.txt"
  cp /tmp/rb-$l/profile.md "$out/profile-$l.md"; gzip -f "$out/$l.log"
}
PARITY_ARGS="" one warm PARITY_RANK_SLOTS=16
PARITY_ARGS="" one s16j8 PARITY_RANK_SLOTS=16
PARITY_ARGS="-j 12" one s24j12 PARITY_RANK_SLOTS=24
PARITY_ARGS="-j 10" one s20j10 PARITY_RANK_SLOTS=20
