#!/usr/bin/env bash
# Round 9 on the H200 host's 16 CPU cores, sent with the `device` tool (carry [".whl"], where
# .whl/old-a5ba92f holds `git archive a5ba92f`, the code before this round):
#   bash results/perf/h200-16-cores-r9/run.sh OUT pairs    # A/B: old and new `parity run`, in turn
#   bash results/perf/h200-16-cores-r9/run.sh OUT baseline # `parity run --baseline` (round 1's harness)
# Also times a CPU rank forkserver's preload with and without Inductor, the change this round measures.
set -u
out=$1; what=$2; label=r9-$what
source "$(dirname "$0")/../device_env.sh"
old=$PWD/.whl/old-a5ba92f
if [ "$what" = pairs ]; then
  DS_ACCELERATOR=cpu TRITON_INTERPRET=1 python3 - > "$out/preload-$label.txt" 2>&1 <<'PY'
import sys, time
t = time.monotonic(); import torch, torch.distributed, parity.harness.rank_worker; a = time.monotonic()
import parity.harness.cpu_rank_preload; b = time.monotonic()
print(f"torch + rank_worker {a - t:.2f} s, frameworks {b - a:.2f} s, Inductor imported by them: {'torch._inductor.config' in sys.modules}")
import torch._inductor.config, torch._inductor.compile_fx; print(f"Inductor (the old preload) {time.monotonic() - b:.2f} s more")
PY
  python3 ci/bench_pair.py --label "matrix-$label" --runs 2 --warmup 0 --log "$out/$label.log" \
    --a "bash -c 'cd $old && exec python3 -m parity.cli run --device cpu --profile --report /tmp/ra'" \
    --b "python3 -m parity.cli run --device cpu --profile --report /tmp/rb" > "$out/bench_pair-$label.txt" 2>&1
  cp /tmp/ra/profile.md "$out/profile-$label-a.md"; cp /tmp/rb/profile.md "$out/profile-$label-b.md"
else
  python3 ci/bench_pair.py --label "matrix-$label" --runs 1 --warmup 0 --log "$out/$label.log" --a "true" \
    --b "python3 -m parity.cli run --device cpu --baseline" > "$out/bench_pair-$label.txt" 2>&1
fi
gzip -f "$out/$label.log"
