#!/usr/bin/env bash
# The robot install's size on disk against the full one (issue 30): a fresh venv with `pip install -e '.[robot]'`
# alone (and gym-aloha's model files), measured beside the project's own venv (`make install`: `.[dev]`, which holds `full`). Prints MB per venv
# (site-packages and all) and what the robot's venv lacks.
#   bash benchmarks/robot_install.sh [/tmp/robot-venv]
set -euo pipefail
venv=${1:-/tmp/robot-venv}
rm -rf "$venv" && .venv/bin/python -m venv "$venv"
start=$(date +%s)
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[robot]' 2>&1 | grep -v '^WARNING: Location' || true
# The sim robot's ALOHA model files only (robotloop.sim.constants.assets_dir), not gym-aloha's dm_control.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps gym-aloha==0.1.5 2>&1 | grep -v '^WARNING: Location' || true
echo "install: $(( $(date +%s) - start )) s (pip's cache warm)"
for v in "$venv" .venv; do echo "$v: $(du -sm "$v" | cut -f1) MB, $("$v/bin/python" -m pip list 2>/dev/null | tail -n +3 | wc -l) packages"; done
for m in torch torchvision lerobot onnxruntime mujoco; do
  "$venv/bin/python" -c "import $m" 2>/dev/null && echo "robot venv: $m present" || echo "robot venv: $m absent"
done
