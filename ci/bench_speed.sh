#!/usr/bin/env bash
# Old against new on this machine, side by side (issue 16's targets), each pair timed A B A B ... by
# ci/bench_pair.py:
#   1. the CPU matrix:  A = parity run --baseline (the harness issue 16 found, kept selectable)
#                       B = parity run (jobs from the cores, shared and overlapped references)
#   2. the report:      A = the writer of the commit BASE (a `git archive` of it on PYTHONPATH)
#                       B = this tree's writer, on the same verdict dicts (ci/bench_report.py),
#                           repeated to 2000 cases with --quick; "figure" is the writing alone
#   3. the soak:        parity run --passes 5: parent and rank RSS after each pass
# Usage: ci/bench_speed.sh [--quick] [--runs N] [--base COMMIT] [--only matrix|report|soak]
#   --quick: every 40th CPU case (about 50) instead of the whole CPU matrix (about 2000).
# Quote medians and the A/B ratios; a wide min-max says the machine was busy. Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0 RUNS="" BASE=e659b8b ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --runs) RUNS="$2"; shift ;;
    --base) BASE="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    *) echo "bench_speed.sh: unknown argument $1 (see the comment at its top)" >&2; exit 2 ;;
  esac
  shift
done
PY=${PY:-.venv/bin/python}  # PY=python3 where the packages are installed system-wide (the GPU host)
WORK=$(mktemp -d /tmp/parity-bench.XXXXXX)
echo "bench_speed.sh: $(nproc) cores, work dir $WORK, baseline commit $BASE, quick=$QUICK"

if [ "$QUICK" = 1 ]; then
  SEL=$($PY -m parity.cli list --device cpu 2>/dev/null | awk 'NR % 40 == 1 { printf " --case %s", $0 }')
  SCALE="--scale 2000" RUNS=${RUNS:-3} WARMUP=1
else
  # The whole CPU matrix: 2 pairs and no warm-up (every run starts its ranks afresh anyway), plus
  # one capture run for the report half: on 2 cores this takes hours, on 16 well under one.
  SEL="--device cpu"
  SCALE="" RUNS=${RUNS:-2} WARMUP=0
fi

if [ -z "$ONLY" ] || [ "$ONLY" = matrix ]; then
  $PY ci/bench_pair.py --label matrix --runs "$RUNS" --warmup "$WARMUP" --log "$WORK/matrix.log" \
    --a "$PY -m parity.cli run --baseline $SEL" --b "$PY -m parity.cli run $SEL"
fi

if [ -z "$ONLY" ] || [ "$ONLY" = report ]; then
  mkdir -p "$WORK/old"
  git archive "$BASE" parity references | tar -x -C "$WORK/old"
  $PY ci/bench_report.py capture "$WORK/records.json.gz" $SEL
  $PY ci/bench_pair.py --label report --runs "$RUNS" --warmup "$WARMUP" --log "$WORK/report.log" --figure 'in ([0-9.]+) s \(parity' \
    --a "env PYTHONPATH=$WORK/old $PY ci/bench_report.py write $WORK/records.json.gz $WORK/report-old $SCALE" \
    --b "$PY ci/bench_report.py write $WORK/records.json.gz $WORK/report-new $SCALE"
fi

if [ -z "$ONLY" ] || [ "$ONLY" = soak ]; then
  $PY -m parity.cli run --passes 5 $SEL | grep -E "^(running|pass [0-9])"
fi
