#!/bin/bash
# Issue 12's figures on one GPU machine, in one go (about 25 minutes; start it detached and follow its log):
#   1. `robotloop loop --preset h200` on an empty cache (the cold run), TransferCube
#   2. `robotloop eval` of its release over 200 other seeds (2000-2199)
#   3. the same training alone (benchmarks/loop_train.py), to compare with the loop's own rate
#   4. `robotloop loop --preset h200 --task insertion`
#   and, when named in $STEPS, issue 14's: `fp8speed` (benchmarks/fp8.py's speed table, side by side) and
#   `fp8train` (`robotloop train --fp8 auto` and `--fp8 off` on step 1's dataset, each checkpoint loaded with
#   lerobot's ACTPolicy.from_pretrained and evaluated on the same 20 seeds)
# Results go to $1 (default /tmp/h200-loop): logs, report.json/report.md, eval_report.json, and results.tar
# holding all of them (a device call returns at most 8 files). Steps: $STEPS (default "tc eval200 alone insertion").
#
#   setsid nohup bash benchmarks/h200_loop.sh /tmp/r > /tmp/r.log 2>&1 &
set -u
R=${1:-/tmp/h200-loop}
STEPS=${STEPS:-tc eval200 alone insertion}
mkdir -p "$R"
export MUJOCO_GL=egl PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d)}
stamp() { echo "$(date +%T) $*" | tee -a "$R/plan.log"; }
pack() {  # the small files only: no weights, videos or bucket data
  (cd "$R" && find . -name robot-store -prune -o -name deploy -prune -o -name staging -prune -o -name keys -prune \
    -o -name videos -prune -o -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.png' \) \
    -size -8M -print | tar czf results.tar.gz -T -)
}
command -v nvidia-smi > /dev/null && { nvidia-smi dmon -s um -d 5 > "$R/dmon.log" 2>&1 & }
has() { [[ " $STEPS " == *" $1 "* ]]; }
if has tc; then
  stamp start tc
  python3 -m robotloop.cli loop --preset h200 --report-dir "$R/tc" > "$R/tc.log" 2>&1
  stamp end tc rc=$?
fi
RUN=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['settings']['run'])" "$R/tc/report.json" 2>/dev/null)
if has eval200 && [ -n "$RUN" ]; then
  stamp start eval200 "$RUN"
  python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/$RUN" --seed 2000 --episodes 200 \
    --workers 15 --videos 0 --output-dir "$R/eval200" > "$R/eval200.log" 2>&1
  stamp end eval200 rc=$?
fi
if has alone && [ -n "$RUN" ]; then
  stamp start alone
  python3 benchmarks/loop_train.py --dataset "hf://buckets/local/loop/datasets/transfer_cube-$RUN" --batch 64 \
    --steps 600 --gc-every 0 500 --out "$R/standalone.json" > "$R/standalone.log" 2>&1
  python3 benchmarks/loop_train.py --dataset "hf://buckets/local/loop/datasets/transfer_cube-$RUN" --batch 64 \
    --steps 600 --like-loop --out "$R/standalone_like_loop.json" > "$R/standalone_like_loop.log" 2>&1
  stamp end alone rc=$?
fi
pack
if has insertion; then
  stamp start insertion
  python3 -m robotloop.cli loop --preset h200 --task insertion --report-dir "$R/ins" > "$R/ins.log" 2>&1
  stamp end insertion rc=$?
fi
pack
if has fp8speed; then
  stamp start fp8speed
  python3 benchmarks/fp8.py --skip parity --speed-side-by-side --out "$R/fp8_speed.json" > "$R/fp8_speed.log" 2>&1
  stamp end fp8speed rc=$?
fi
if has fp8train && [ -n "$RUN" ]; then
  stamp start fp8train
  pids=()
  for mode in auto off; do
    python3 -m robotloop.cli train --dataset "hf://buckets/local/loop/datasets/transfer_cube-$RUN" \
      --output "hf://buckets/local/loop/models/fp8-$mode-$RUN" --steps 1000 --batch-size 64 --fp8 $mode \
      --checkpoint-every 1000 --decode-workers 4 > "$R/fp8train-$mode.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"  # not dmon
  for mode in auto off; do
    python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/fp8-$mode-$RUN" --episodes 20 --workers 10 \
      --videos 0 --output-dir "$R/fp8eval-$mode" > "$R/fp8eval-$mode.log" 2>&1
    python3 -c "import json, sys; from lerobot.policies.act.modeling_act import ACTPolicy
path = json.load(open(sys.argv[1]))['policy']; policy = ACTPolicy.from_pretrained(path)
print('lerobot ACTPolicy.from_pretrained loaded', path, sum(p.numel() for p in policy.parameters()), 'parameters')" \
      "$R/fp8eval-$mode/eval_report.json" > "$R/fp8load-$mode.log" 2>&1
  done
  stamp end fp8train
fi
pack
stamp done
touch "$R/done"
