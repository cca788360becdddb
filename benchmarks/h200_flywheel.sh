#!/bin/bash
# Issue 29's rounds through the fleet on one GPU machine: `robotloop loop --preset h200 --rounds K` with the fair
# baseline, every evaluation on the same $EVAL seeds (1000 upwards), from an empty cache. Then the final stable
# release is evaluated again, independently, over 200 other seeds (5000-5199) by `robotloop eval`.
# Last, lerobot's own `lerobot-eval` runs that release in gym-aloha's env ($LEROBOT_EVAL episodes, 0: not at all).
# BASELINE=0 leaves the baseline out (it costs each round its own recording, training and evaluation again).
# Start it detached and follow it (benchmarks/device_follow.sh $R): its plan.log ends with " done".
#   TASK=transfer_cube ROUNDS=1 EVAL=200 setsid nohup bash benchmarks/h200_flywheel.sh /tmp/fw > /tmp/fw.log 2>&1 &
# Insertion's next run (after 2026-12-07 17:52, BENCHMARKS.md, where two rounds whose expert also demonstrated the
# 3 fresh scenes nearest each one the policy did not win alone reached 94.5% on the loop's seeds, lower bound 90.4%,
# in 13.9 min on an H100, and the fleet led the baseline within noise twice): three such rounds (a third at round
# 2's pace: about 17.3 min) with the baseline beside round 1 only (about 2.7 min more, apart in the report's
# minutes), then the last release on seeds 5000-5199 and in lerobot-eval, and round 1 and its baseline again over
# 1,000 paired scenes from 6000 (the loop evaluated 200 episodes in 7-12 s; about 24 min in all):
#   TASK=insertion ROUNDS=3 BASELINE=0 BASELINE_ROUNDS=1 PAIRED_EVAL=1000 INDEPENDENT=1 LEROBOT_EVAL=20 ONNX_EVAL=0 \
#     INT8_EVAL=0 FLEET_CHECK=0 ROUND_ARGS="--shadow-map 2048 --fleet-rate-hz inf --redemo-near 3" \
#     bash benchmarks/h200_flywheel.sh /tmp/fw
# With less device time than that: the three rounds alone (BASELINE_ROUNDS and PAIRED_EVAL unset, about 19 min); with
# under 15 min, round 1 and its baseline alone (ROUNDS=1 BASELINE=1 EVAL=400, 13.9 min on 2026-12-07 17:38).
# (ABLATION=share50,long: the round's data trained two stronger ways after it, never run to the end yet)
set -u
R=${1:-/tmp/flywheel}
TASK=${TASK:-transfer_cube}
ROUNDS=${ROUNDS:-1}
EVAL=${EVAL:-200}
BASELINE=${BASELINE:-1}
BASELINE_ROUNDS=${BASELINE_ROUNDS:-}  # e.g. 1: the baseline beside round 1 only (`--baseline-rounds`; implies it)
# Episodes (0: none) of the last round that ran a baseline and of that baseline, evaluated again after the loop on
# the same other seeds (from 6000), the baseline's run paired with the round's (`robotloop eval --against`)
PAIRED_EVAL=${PAIRED_EVAL:-0}
LEROBOT_EVAL=${LEROBOT_EVAL:-50}
ONNX_EVAL=${ONNX_EVAL:-50}  # episodes of stable's ONNX export on ONNX Runtime's CPU provider (the image has no GPU one), 0: none
INT8_EVAL=${INT8_EVAL:-50}  # episodes of its int8 graph (quantized here, as deploy publish --onnx-int8 does), 0: none
ONNX_SEED=${ONNX_SEED:-1000}  # the ONNX and int8 evaluations' first seed (1000: paired with the loop's own evaluation)
INDEPENDENT=${INDEPENDENT:-1}  # 1: stable evaluated again over seeds 5000-5199, 0: not
ROUND_ARGS=${ROUND_ARGS:-}  # more `robotloop loop` options, e.g. "--round-steps 6000 --round-lr-scale 0.3"; with
# "--shadow-map 2048" the whole run films (and so evaluates) with 2048-texel shadow maps; SHADOW_EVAL then compares
# against them, not against gym-aloha's 4096
FLEET_CHECK=${FLEET_CHECK:-1}  # stable in lockstep on the fleet's own scenes, paired with the robots' episodes
ABLATION=${ABLATION:-}  # e.g. demos,seed1,scratch: round 1's training variants (benchmarks/round_ablation.py) after the loop
# e.g. "off:20 -0.02 off:100": stable evaluated again on the loop's $EVAL seeds acting otherwise, one evaluation each:
# ACT's temporal ensembling coefficient or off, then ":" the actions executed from each chunk (robotloop eval's
# --temporal-ensemble and --action-steps)
ACTING_EVAL=${ACTING_EVAL:-}
SHADOW_EVAL=${SHADOW_EVAL:-0}  # e.g. 2048: stable evaluated again on the same $EVAL seeds with these shadow maps, 0: not
# A rehearsal of the whole script on a CPU machine, before device time is spent on it (every step, tiny sizes):
#   PRESET=cpu WORKERS=2 DEVICE=cpu EVAL=2 INDEPENDENT_EPISODES=2 LEROBOT_EVAL=1 ONNX_EVAL=2 INT8_EVAL=2 \
#   ROUND_ARGS="--episodes 1 --steps 4 --round-steps 4 --fleet 1 --fleet-episodes 1" bash benchmarks/h200_flywheel.sh /tmp/fw
PRESET=${PRESET:-h200}
WORKERS=${WORKERS:-15}  # sim workers of every evaluation after the loop's
DEVICE=${DEVICE:-cuda}  # where lerobot-eval runs the policy
INDEPENDENT_EPISODES=${INDEPENDENT_EPISODES:-200}
source "$(dirname "$0")/device_setup.sh"
cd "$work"
ln -sfn "$work/loop-report" "$R/loop-report"  # the report as the loop rewrites it after each round: device_follow.sh
# Beside round 0 (a minute of imports, no training's GPU memory): which robot import starts CUDA on this machine, the
# reason the fleet's fork server may have to spawn its robots (benchmarks/fork_cuda_check.py); in results.tar.gz.
[ "$DEVICE" = cuda ] && { python3 "$root/benchmarks/fork_cuda_check.py" > "$R/fork_cuda_check.log" 2>&1 & }
pack() {  # the small files only: no weights, videos or bucket data
  (cd "$R" && find . -name videos -prune -o -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -8M \
    -print | tar czf results.tar.gz.part -T - && mv results.tar.gz.part results.tar.gz)
}
step "rounds start (main at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"
start=$(date +%s)
baseline=$([ "$BASELINE" = 1 ] && echo --baseline)
[ -n "$BASELINE_ROUNDS" ] && baseline="--baseline-rounds $BASELINE_ROUNDS"
check=$([ "$FLEET_CHECK" = 1 ] && echo --fleet-check)
# shellcheck disable=SC2086  # $baseline and $check are one flag or none, $ROUND_ARGS words
python3 -m robotloop.cli loop --preset "$PRESET" --task "$TASK" --rounds "$ROUNDS" $baseline $check $ROUND_ARGS --eval-episodes "$EVAL" \
  > "$R/loop.log" 2>&1
step "rounds exit $? after $(( $(date +%s) - start )) s"
cp loop-report/report.json loop-report/report.md "$R/" 2>/dev/null
for f in loop-report/eval/eval_report.json loop-report/eval-*/eval_report.json; do [ -f "$f" ] && cp "$f" "$R/$(basename "$(dirname "$f")").json"; done
pack
# the release stable runs at the end (a loop without rounds: its one release)
stable=$(python3 -c "import json; r = json.load(open('loop-report/report.json')); print(r.get('stable') or r['release'])" 2>/dev/null)
if [ -n "$ABLATION" ]; then  # side by side on the GPU, then each evaluated on the loop's seeds
  python3 "$root/benchmarks/round_ablation.py" --variants "$ABLATION" --preset "$PRESET" --out "$R/ablation" \
    > "$R/ablation.log" 2>&1
  step "ablation $ABLATION exit $?"
  pack
fi
for acting in $ACTING_EVAL; do  # paired with the loop's own evaluation of stable: the same seeds and rendering
  [ -n "$stable" ] || break
  coeff=${acting%%:*}
  steps=$([ "$coeff" != "$acting" ] && echo "--action-steps ${acting#*:}")
  # shellcheck disable=SC2086  # $steps is one option and its value, or nothing
  python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/${stable%-*}" --sim "$TASK" \
    --episodes "$EVAL" --seed 1000 --workers "$WORKERS" --videos 0 --temporal-ensemble="$coeff" $steps \
    --output-dir "$R/eval-acting-$acting" > "$R/eval_acting_$acting.log" 2>&1
  step "eval of $stable acting $acting ($EVAL seeds from 1000) exit $?"
  pack
done
if [ -n "$stable" ] && [ "$INDEPENDENT" = 1 ]; then  # the release's run: its name without the step
  python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/${stable%-*}" --sim "$TASK" \
    --episodes "$INDEPENDENT_EPISODES" --seed 5000 --workers "$WORKERS" --videos 0 --output-dir "$R/eval-5000" \
    > "$R/eval5000.log" 2>&1
  step "eval of $stable over $INDEPENDENT_EPISODES seeds from 5000 exit $?"
  pack
fi
if [ "$PAIRED_EVAL" -gt 0 ]; then  # the checkpoints the loop's own evaluations of the pair resolved
  k=$(python3 -c "import json; r = json.load(open('loop-report/report.json'))
print(max((x['round'] for x in r['rounds'] if x.get('baseline')), default=''))" 2>/dev/null)
  for side in r baseline-r; do
    model=$(python3 -c "import json; print(json.load(open('loop-report/eval-$side$k/eval_report.json'))['policy'])" 2>/dev/null)
    [ -n "$k" ] && [ -n "$model" ] || break
    against=$([ "$side" = baseline-r ] && echo "--against $R/paired-r$k/eval_report.json")
    # shellcheck disable=SC2086  # $against is one option and its value, or nothing
    python3 -m robotloop.cli eval --policy "$model" --sim "$TASK" --episodes "$PAIRED_EVAL" --seed 6000 \
      --workers "$WORKERS" --videos 0 $against --output-dir "$R/paired-$side$k" > "$R/paired_$side$k.log" 2>&1
    step "eval of $side$k over $PAIRED_EVAL seeds from 6000 exit $?"
    pack
  done
fi
if [ -n "$stable" ] && [ "$SHADOW_EVAL" != 0 ]; then  # what rendering faster costs: the same seeds as the loop's
  python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/${stable%-*}" --sim "$TASK" \
    --episodes "$EVAL" --seed 1000 --workers "$WORKERS" --videos 0 --shadow-map "$SHADOW_EVAL" \
    --output-dir "$R/eval-shadow-$SHADOW_EVAL" > "$R/eval_shadow.log" 2>&1
  step "eval of $stable with $SHADOW_EVAL shadow maps ($EVAL seeds from 1000) exit $?"
  pack
fi
if [ -n "$stable" ]; then
  # stable's checkpoint as the loop's own evaluation of it resolved it: eval for round 0, eval-r<k> after
  case "$stable" in *-r[0-9]*-*) k=${stable%-*}; evaluated=eval-r${k##*-r} ;; *) evaluated=eval ;; esac
  model=$(python3 -c "import json; print(json.load(open('loop-report/$evaluated/eval_report.json'))['policy'])" 2>/dev/null)
  gym_task=$([ "$TASK" = insertion ] && echo AlohaInsertion-v0 || echo AlohaTransferCube-v0)
  # lerobot's own evaluation, in gym-aloha's env. Synchronous envs: lerobot imports gym_aloha (which registers
  # the envs) in the driver only, and the async workers it spawns failed with "Namespace gym_aloha not found".
  if [ "$LEROBOT_EVAL" -gt 0 ] && [ -n "$model" ]; then
    python3 -m lerobot.scripts.lerobot_eval --policy.path="$model" --env.type=aloha --env.task="$gym_task" \
      --eval.n_episodes="$LEROBOT_EVAL" --eval.batch_size=10 --eval.use_async_envs=false --policy.device="$DEVICE" \
      --seed=7000 --output_dir="$R/lerobot-eval" > "$R/lerobot_eval.log" 2>&1
    step "lerobot-eval of $stable ($LEROBOT_EVAL episodes, seed 7000) exit $?"
  fi
  if [ "$ONNX_EVAL" -gt 0 ]; then  # the checkpoint's ONNX export (training leaves it beside the last checkpoint)
    python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/${stable%-*}" --sim "$TASK" \
      --episodes "$ONNX_EVAL" --seed "$ONNX_SEED" --workers "$WORKERS" --videos 0 --backend onnx --device cpu --output-dir "$R/eval-onnx" \
      > "$R/eval_onnx.log" 2>&1
    step "ONNX eval of $stable ($ONNX_EVAL episodes, seeds $ONNX_SEED+) exit $?"
  fi
  if [ "$INT8_EVAL" -gt 0 ] && [ -n "$model" ]; then  # the same seeds as the fp32 ONNX eval, paired
    # as `deploy publish --onnx-int8` makes it: the convolutions calibrated on 50 frames of the run's training data
    python3 "$root/benchmarks/int8_calibrated.py" "$model" "hf://buckets/local/loop/models/${stable%-*}" \
      > "$R/eval_int8.log" 2>&1 &&
      python3 -m robotloop.cli eval --policy "$model" --sim "$TASK" --episodes "$INT8_EVAL" --seed "$ONNX_SEED" --workers "$WORKERS" \
        --videos 0 --backend onnx-int8 --device cpu --output-dir "$R/eval-int8" >> "$R/eval_int8.log" 2>&1
    step "ONNX int8 eval of $stable ($INT8_EVAL episodes, seeds $ONNX_SEED+) exit $?"
  fi
fi
pack
step "done"
pack
