#!/bin/bash
# Issue 29's rounds through the fleet on one GPU machine: `robotloop loop --preset h200 --rounds K` with the fair
# baseline, every evaluation on the same $EVAL seeds (1000 upwards), from an empty cache. Then the final stable
# release is evaluated again, independently, over 200 other seeds (5000-5199) by `robotloop eval`.
# Start it detached and follow it (benchmarks/device_follow.sh $R): its plan.log ends with " done".
#   TASK=transfer_cube ROUNDS=1 EVAL=200 setsid nohup bash benchmarks/h200_flywheel.sh /tmp/fw > /tmp/fw.log 2>&1 &
set -u
R=${1:-/tmp/flywheel}
TASK=${TASK:-transfer_cube}
ROUNDS=${ROUNDS:-1}
EVAL=${EVAL:-200}
mkdir -p "$R"
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
export XDG_CACHE_HOME=$work/cache
cd "$work"
pack() { tar -czf "$R/results.tar.gz" -C "$R" --exclude results.tar.gz . 2>/dev/null; }
echo "$(date -u +%FT%TZ) rounds start (main at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))" >> "$R/plan.log"
start=$(date +%s)
python3 -m robotloop.cli loop --preset h200 --task "$TASK" --rounds "$ROUNDS" --baseline --eval-episodes "$EVAL" \
  > "$R/loop.log" 2>&1
echo "$(date -u +%FT%TZ) rounds exit $? after $(( $(date +%s) - start )) s" >> "$R/plan.log"
cp loop-report/report.json loop-report/report.md "$R/" 2>/dev/null
pack
stable=$(python3 -c "import json; print(json.load(open('loop-report/report.json'))['stable'])" 2>/dev/null)
if [ -n "$stable" ]; then  # the release's run: its name without the step
  python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/${stable%-*}" --sim "$TASK" --episodes 200 \
    --seed 5000 --workers 15 --videos 0 --output-dir "$R/eval-5000" > "$R/eval5000.log" 2>&1
  echo "$(date -u +%FT%TZ) eval of $stable over seeds 5000-5199 exit $?" >> "$R/plan.log"
fi
pack
echo "$(date -u +%FT%TZ) done" >> "$R/plan.log"
pack
