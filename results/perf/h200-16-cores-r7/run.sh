#!/usr/bin/env bash
# Round 7 on the H200 host's 16 CPU cores, sent with the `device` tool (carry [".whl"]):
#   bash results/perf/h200-16-cores-r7/run.sh OUT LABEL [parity run options...]
# Where does the 16-core run leave the cores idle? One `parity run --device cpu --profile` (default -j)
# under getrusage (the CPU seconds of every process it reaped) with `vmstat 1` beside it (the
# machine's user/system/idle share each second).
set -u
out=$1; label=$2; shift 2
source "$(dirname "$0")/../device_env.sh"
vmstat -n 1 > "$out/vmstat-$label.txt" & vm=$!
# getrusage(RUSAGE_CHILDREN): the CPU seconds of every process the run reaped, its ranks and jobs included.
python3 - "$out/time-$label.txt" python3 -m parity.cli run --device cpu --profile --report /tmp/rb-$label "$@" > "$out/$label.log" 2>&1 <<'PY'
import resource, subprocess, sys, time
start = time.monotonic()
rc = subprocess.call(sys.argv[2:])
wall = time.monotonic() - start
r = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    print(f"rc {rc} wall {wall:.1f} s user {r.ru_utime:.1f} s sys {r.ru_stime:.1f} s "
          f"cpu/wall {(r.ru_utime + r.ru_stime) / wall:.2f} (of {__import__('os').cpu_count()} cores)", file=f)
PY
kill $vm
cp "/tmp/rb-$label/profile.md" "$out/profile-$label.md"; gzip -f "$out/$label.log"
