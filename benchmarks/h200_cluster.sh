#!/bin/bash
# Issue 31's figures on the 16-core GPU machine, one after the other so that none shares the cores with another:
#   1. 1,000 simulated robots and 16 uploaders for 60 s on two deploy replicas and two bucket servers over one
#      PostgreSQL (benchmarks/load.py);
#   2. the same on one SQLite deploy service and bucket server;
#   3. Ray against the process pool: evaluation and recording episodes/min at 1, 2, 4, 8 and 15 workers
#      (benchmarks/ray_throughput.py, the h200 preset's 120x160 camera, default-size ACT on the GPU).
# The PostgreSQL case goes first: it is the one a lease cut short twice.
# Needs .gpu/'s and .gpu-cluster/'s packages unpacked (benchmarks/pack_cluster.sh says how). Start it detached and
# follow it:
#   setsid nohup bash benchmarks/h200_cluster.sh /tmp/cl > /tmp/cl.log 2>&1 &
#   bash benchmarks/device_follow.sh /tmp/cl 560      # its plan.log ends with " done"
# On the H100 machine (2026-12-06) the Ray part took 8 min, the SQLite load case 5.3. SKIP="ray", "load", "sqlite"
# or "postgres" (several: "ray,sqlite") leaves parts out; RAY_ARGS and LOAD_ARGS replace the sizes (a CPU smoke run:
#   RAY_ARGS="--workers 1 --episodes 1 --max-steps 20 --image-size 48x64 --size tiny --codec h264"
#   LOAD_ARGS="--robots 20 --fleet-procs 1 --uploaders 2 --seconds 5").
set -u
R=${1:-/tmp/cluster-bench}
SKIP=${SKIP:-}
RAY_ARGS=${RAY_ARGS:---workers 1 2 4 8 15 --episodes-per-worker 2 --device cuda --size full --image-size 120x160}
LOAD_ARGS=${LOAD_ARGS:---robots 1000 --fleet-procs 8 --uploaders 16 --seconds 60}
source "$(dirname "$0")/device_setup.sh"
cd "$root"
pack() { (cd "$R" && tar czf results.tar.gz.part --exclude=results.tar.gz* . && mv results.tar.gz.part results.tar.gz); }
step "cluster start (main at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores)"

read -ra load <<< "$LOAD_ARGS"
if [[ $SKIP != *load* && $SKIP != *postgres* ]]; then
  # A throwaway PostgreSQL as the suite starts it (tests/pgserver.py), stopped after: the pack's build, no ICU.
  python3 benchmarks/load.py "${load[@]}" --postgres --replicas 2 --out "$R/load_postgres.json" \
    > "$R/load_postgres.log" 2>&1
  step "load postgres exit $?"
  pack
fi
if [[ $SKIP != *load* && $SKIP != *sqlite* ]]; then
  python3 benchmarks/load.py "${load[@]}" --out "$R/load_sqlite.json" > "$R/load_sqlite.log" 2>&1
  step "load sqlite exit $?"
  pack
fi
if [[ $SKIP != *ray* ]]; then
  # shellcheck disable=SC2086  # words
  python3 benchmarks/ray_throughput.py $RAY_ARGS > "$R/ray_throughput.jsonl" 2> "$R/loop.log"
  step "ray_throughput exit $?"
  pack
fi

step "done"
