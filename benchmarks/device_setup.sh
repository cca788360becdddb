# Sourced by the GPU-machine scripts (h200_flywheel.sh, h200_cluster.sh) once they have set R, their results folder:
# a fresh $R (one left by an earlier run, since a machine can keep /tmp, is moved aside, never mixed in), the
# environment, a cache of the run's own under $work, the repository's root as $root, nvidia-smi dmon beside it, and
# `step TEXT`, which adds a timed line to $R/plan.log (device_follow.sh waits for its " done").
[ -e "$R" ] && mv "$R" "$R.before-$(date +%s)"
mkdir -p "$R"
export PYTHONUNBUFFERED=1 MUJOCO_GL=egl
# torch's allocator in growable segments, as the Insertion run of 2026-12-06 on an H100 had it (its first try, without,
# failed to find one 39 GiB block for the frame buffer beside 12 GiB cached but unused; the buffer now copes either
# way, BENCHMARKS.md). Kept so that the runs after it compare with it.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d)
export XDG_CACHE_HOME=$work/cache
command -v nvidia-smi > /dev/null && { nvidia-smi dmon -s um -d 5 > "$R/dmon.log" 2>&1 & }
# `step "x exit $?"` reads the exit status where it is called: inside `echo "$(date) ... $?"` the date's command
# substitution runs first and $? is always 0 (the flywheel's plan.log said "exit 0" for steps that failed).
step() { echo "$(date -u +%FT%TZ) $*" >> "$R/plan.log"; }
# Lent machines of one kind differ in their hosts (2026-12-07: an H100 whose host trained 13% slower and started the
# fleet's robots three times slower than another's): the plan names the CPU and the GPU it ran on.
step "host: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores; GPU: $(nvidia-smi \
  --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
