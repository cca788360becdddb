#!/bin/bash
# Follow a detached benchmarks/h200_loop.sh run from a device call: wait until its plan says "done" or `$2` seconds
# pass (default 560, under the call's 10 minutes), copying its results tarball, plan and logs into $OUT every 15 s,
# so a call cut short (or a run the lease cuts) still brings back everything packed or printed so far.
#   bash benchmarks/device_follow.sh /tmp/r 560
R=${1:-/tmp/h200-loop}
end=$((SECONDS + ${2:-560}))
# The results a step writes as it goes (*.jsonl, a line per case; the ablation's json, rewritten per variant) come too:
# a call cut mid-step keeps them.
# So does the flywheel's report, rewritten after each round (and each baseline), with every evaluation's episodes.
copy() {
  cp -f "$R/results.tar.gz" "$R/plan.log" "$R/loop.log" "$R/dmon.log" "$R"/*.jsonl "$R"/load_*.json "$R"/load_*.log \
    "$R"/ablation/ablation.json "$R"/loop-report/report.json "$OUT/" 2>/dev/null
  for f in "$R"/loop-report/eval*/eval_report.json "$R"/eval-5000/eval_report.json; do [ -f "$f" ] && cp -f "$f" "$OUT/$(basename "$(dirname "$f")").json"; done
}
while [ $SECONDS -lt $end ] && ! grep -q " done$" "$R/plan.log" 2>/dev/null; do
  copy
  sleep 15
done
copy
cat "$R/plan.log" 2>/dev/null
tail -n 5 "$R"/*.log 2>/dev/null | tail -n 60
