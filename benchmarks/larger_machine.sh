#!/usr/bin/env bash
# The scaling and planning tables on the larger machine (16 cores; no network): installs
# the wheels in .whl/ (dask, distributed and their pure-Python dependencies; see
# /work/shared/design/MEASURING.md), then writes each table's rows under $OUT.
#     OUT=/some/dir bash benchmarks/larger_machine.sh
set -uo pipefail
OUT=${OUT:-/tmp/tra-dask-larger}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --find-links .whl dask distributed partd locket tblib zict tornado 2>&1 | tail -2
export PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-}
cd benchmarks
cp README.md "$OUT/README.before.md"
timeout 470 python3 scaling.py --n 3072 --repeat 2 2>&1 | grep -v "UserWarning\|warnings.warn\|Consider\|or using\|See also" | tee "$OUT/scaling.txt"
cp README.md "$OUT/README.scaling.md"
for s in 16 64 256 1024; do  # one process per site count, side by side (planning uses one core)
  timeout 200 python3 planning_sites.py --sites $s --timeout 60 --no-write --json "$OUT/planning_$s.json" > "$OUT/planning_$s.txt" 2>&1 &
done
wait
cat "$OUT"/planning_*.txt
