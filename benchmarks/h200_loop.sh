#!/bin/bash
# Issue 12's figures on one GPU machine, in one go (start it detached and follow its log):
#   tc        `robotloop loop --preset h200` on an empty cache (the cold run), TransferCube
#   eval200   `robotloop eval` of its release over 200 other seeds (2000-2199)
#   alone     the same training alone (benchmarks/loop_train.py), to compare with the loop's own rate
#   insertion `robotloop loop --preset h200 --task insertion`
#   insweep   Insertion recipes side by side (benchmarks/recipes.py --task insertion: 100 demos, then one training
#             per recipe in $SWEEP_RECIPES sharing the GPU, each evaluated on the same 50 seeds): which recipe the
#             preset should use ($SWEEP_RECIPES, $SWEEP_STEPS, $SWEEP_TRAIN_S, $SWEEP_EVAL_PLAN;
#             $SWEEP_BUFFER_GB per trainer: 100 Insertion demos are 35 GiB of 480x640 frames)
# and issue 14's:
#   fp8train  `robotloop train --fp8 auto` and `--fp8 off` on tc's dataset, each checkpoint loaded with lerobot's
#             ACTPolicy.from_pretrained and evaluated on the same 20 seeds
#   fp8prof   benchmarks/fp8_profile.py on the large ACT at batch 128, bf16 against tensorwise: eager, then compiled
#             with TORCH_LOGS naming graph breaks and skipped CUDA graphs (one process at a time: ~20 GiB each)
#   fp8speed  benchmarks/fp8.py's speed table, side by side in waves ($FP8_WAVES, default the large ACT's five
#             processes, then the default ACT's ten: all fifteen at once would not fit the GPU's memory; $FP8_MODES,
#             where a mode named twice runs twice: FP8_MODES="off auto off auto" measures the run's own noise;
#             $FP8_INDUCTOR, torch._inductor.config entries for every process, e.g. triton.prefer_nd_tiling=True)
# $STEPS names them in order (default "tc alone insertion+eval200"); steps joined by "+" run at the same time
# (timings of a step that shared the machine say so in BENCHMARKS.md). Results go to $1 (default /tmp/h200-loop):
# logs, report.json/report.md, eval_report.json, and results.tar.gz holding all of them, rebuilt as each step ends
# (a device call returns at most 8 files).
#
#   setsid nohup bash benchmarks/h200_loop.sh /tmp/r > /tmp/r.log 2>&1 &
set -u
R=${1:-/tmp/h200-loop}
STEPS=${STEPS:-tc alone insertion+eval200}
EVAL_WORKERS=${EVAL_WORKERS:-15}
mkdir -p "$R"
export MUJOCO_GL=egl PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d)}
stamp() { echo "$(date +%T) $*" | tee -a "$R/plan.log"; }
pack() {  # the small files only: no weights, videos or bucket data
  local part="results.tar.gz.$BASHPID"  # steps side by side pack at once
  (cd "$R" && find . -name robot-store -prune -o -name deploy -prune -o -name staging -prune -o -name keys -prune \
    -o -name videos -prune -o -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.png' -o -name '*.txt' \) \
    -size -8M -print | tar czf "$part" -T - && mv "$part" results.tar.gz)
}
run_id() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['settings']['run'])" "$R/tc/report.json"; }
dataset() { echo "hf://buckets/local/loop/datasets/transfer_cube-$(run_id)"; }

step_tc() { python3 -m robotloop.cli loop --preset h200 --report-dir "$R/tc" > "$R/tc.log" 2>&1; }
step_eval200() {
  python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/$(run_id)" --seed 2000 --episodes 200 \
    --workers "$EVAL_WORKERS" --videos 0 --output-dir "$R/eval200" > "$R/eval200.log" 2>&1
}
step_alone() {
  python3 benchmarks/loop_train.py --dataset "$(dataset)" --batch 64 --steps 600 --gc-every 0 500 \
    --out "$R/standalone.json" > "$R/standalone.log" 2>&1
  python3 benchmarks/loop_train.py --dataset "$(dataset)" --batch 64 --steps 600 --like-loop \
    --out "$R/standalone_like_loop.json" > "$R/standalone_like_loop.log" 2>&1
}
step_insertion() { python3 -m robotloop.cli loop --preset h200 --task insertion --report-dir "$R/ins" > "$R/ins.log" 2>&1; }
step_insweep() {
  # shellcheck disable=SC2086  # SWEEP_RECIPES is a list
  python3 benchmarks/recipes.py --task insertion --episodes 100 --steps "${SWEEP_STEPS:-6000}" \
    --recipes ${SWEEP_RECIPES:-base mid-long} --max-train-s "${SWEEP_TRAIN_S:-540}" \
    --buffer-gb "${SWEEP_BUFFER_GB:-36}" \
    --eval-plan "${SWEEP_EVAL_PLAN:-standard}" --out-dir "$R/insweep" > "$R/insweep.log" 2>&1
}
step_fp8prof() {
  python3 benchmarks/fp8_profile.py --case large-b128 --modes off tensorwise --out-dir "$R/fp8prof/eager" \
    > "$R/fp8prof-eager.log" 2>&1
  TORCH_LOGS=graph_breaks,recompiles,perf_hints python3 benchmarks/fp8_profile.py --case large-b128 \
    --modes off tensorwise --compiled --out-dir "$R/fp8prof/compiled" > "$R/fp8prof-compiled.log" 2>&1
}
step_fp8speed() {
  # shellcheck disable=SC2086  # FP8_WAVES is a list
  python3 benchmarks/fp8.py --skip parity --speed-side-by-side --speed-waves ${FP8_WAVES:-large-b128 default-b8,default-b64} \
    --modes ${FP8_MODES:-off tensorwise rowwise rowwise_with_gw_hp auto} ${FP8_INDUCTOR:+--inductor $FP8_INDUCTOR} \
    --out "$R/fp8_speed.json" > "$R/fp8_speed.log" 2>&1
}
step_fp8train() {
  local mode pids=()
  for mode in auto off; do
    python3 -m robotloop.cli train --dataset "$(dataset)" --output "hf://buckets/local/loop/models/fp8-$mode-$(run_id)" \
      --steps 1000 --batch-size 64 --fp8 $mode --checkpoint-every 1000 --decode-workers 4 \
      > "$R/fp8train-$mode.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  for mode in auto off; do
    python3 -m robotloop.cli eval --policy "hf://buckets/local/loop/models/fp8-$mode-$(run_id)" --episodes 20 \
      --workers 10 --videos 0 --output-dir "$R/fp8eval-$mode" > "$R/fp8eval-$mode.log" 2>&1
    python3 -c "import json, sys; from lerobot.policies.act.modeling_act import ACTPolicy
path = json.load(open(sys.argv[1]))['policy']; policy = ACTPolicy.from_pretrained(path)
print('lerobot ACTPolicy.from_pretrained loaded', path, sum(p.numel() for p in policy.parameters()), 'parameters')" \
      "$R/fp8eval-$mode/eval_report.json" > "$R/fp8load-$mode.log" 2>&1
  done
}

# Every command must build with the GPU image's own Typer (0.27 there): fail in a second, not after each step.
python3 -c "from typer.main import get_command; from robotloop.cli import app; get_command(app)" > "$R/cli.log" 2>&1 \
  || { stamp "the CLI does not build here: $R/cli.log"; pack; exit 1; }
command -v nvidia-smi > /dev/null && { nvidia-smi dmon -s um -d 5 > "$R/dmon.log" 2>&1 & }
for group in $STEPS; do
  pids=()
  for s in ${group//+/ }; do
    (stamp start "$s"; "step_$s"; stamp end "$s" rc=$?; pack) &
    pids+=($!)
  done
  wait "${pids[@]}"
  pack
done
stamp done
pack
