#!/usr/bin/env bash
set -u
out=$1; label=ab2
source "$(dirname "$0")/../device_env.sh"
one() { local l=$1; shift; local t0=$(date +%s.%N)
  env "$@" python3 -m parity.cli run --device cpu --profile --report /tmp/rb-$l $ARGS > "$out/$l.log" 2>&1
  echo "$l wall $(python3 -c "print(round($(date +%s.%N)-$t0,2))") $(grep -E 'passed.*failed' $out/$l.log | tail -1)" | tee -a "$out/summary.txt"
  cp /tmp/rb-$l/profile.md "$out/profile-$l.md"; gzip -f "$out/$l.log"; }
ARGS="" one b8 X=1
ARGS="" one a8 PARITY_EXP_OLD=1
ARGS="-j 12" one b12s24 PARITY_RANK_SLOTS=24
ARGS="-j 10" one b10s20 PARITY_RANK_SLOTS=20
