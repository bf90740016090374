#!/usr/bin/env bash
# A/B of kernel source on one GPU in one run: the working tree's kernels against a base
# version of some of their files, timed alternately (A B A B ...) by the same microbenchmark
# so that a gain smaller than the spread between two leases still shows. FA3 and SDPA rows,
# if asked for, anchor both.
#   bash docs/perf/kernel-ab.sh BASE_DIR ROUNDS microbench-args...
# BASE_DIR holds the base's files at their paths under kernels/ (e.g. BASE_DIR/steps/blocks.py,
# from `git show REV:kernels/steps/blocks.py`; /.ab-base/ is git-ignored for this): it must
# travel with the call (`carry`).
# Writes $AB_DIR (default $OUT/ab)/{base,work}-rN.csv; `attnbench` CSVs, one per round.
base_dir=${1:?BASE_DIR}; rounds=${2:?ROUNDS}; shift 2
. docs/perf/gpu-setup.sh
set -eu
out=${AB_DIR:-${OUT:-/tmp}/ab}; mkdir -p "$out"
rm -rf /tmp/attnbench-base && cp -r /tmp/attnbench /tmp/attnbench-base
cp -r "$base_dir"/. /tmp/attnbench-base/attnbench/kernels/
diff -rq /tmp/attnbench/attnbench/kernels /tmp/attnbench-base/attnbench/kernels | grep -v __pycache__ || true
for r in $(seq 1 "$rounds"); do
  for side in base work; do
    [ -s "$out/$side-r$r.csv" ] && continue
    root=/tmp/attnbench; [ $side = base ] && root=/tmp/attnbench-base
    PYTHONPATH=$root:$PYTHONPATH python3 -m attnbench.cli microbench "$@" --out "$out/$side-r$r.csv" \
      > "$out/$side-r$r.log" 2>&1 || tail -5 "$out/$side-r$r.log"
  done
done
python3 - "$out" <<'PY'
import csv, statistics, sys
from pathlib import Path
rows = {}
for f in sorted(Path(sys.argv[1]).glob("*-r*.csv")):
    side = f.name.split("-r")[0]
    for r in csv.DictReader(open(f)):
        if r["status"] == "ok":
            best = min(float(r["median_us"]), float(r["graph_median_us"] or "inf"))
            rows.setdefault((r["case"], r["implementation"], side), []).append(best)
print(f"{'case':24s} {'impl':10s} {'base us':>9s} {'work us':>9s} {'work/base':>9s}")
for case, impl in sorted({k[:2] for k in rows}):
    b, w = rows.get((case, impl, "base")), rows.get((case, impl, "work"))
    if b and w:
        print(f"{case:24s} {impl:10s} {statistics.median(b):9.1f} {statistics.median(w):9.1f} "
              f"{statistics.median(w) / statistics.median(b):9.3f}")
PY
