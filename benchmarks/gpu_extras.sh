#!/usr/bin/env bash
# Adds to .gpu/ (made by ../shared/gpu/pack.sh) what lerobot-eval needs there and pack.sh leaves out: gym-aloha
# imports dm_control (116 MB installed, mostly the locomotion and dog assets ALOHA never loads). This packs it
# without them, with dm_env and dm-tree, as .gpu/dm_control.tar.xz (about 6 MB); benchmarks/h200_flywheel.sh
# unpacks it into the device's site folder before lerobot-eval.
#   ../shared/gpu/pack.sh && bash benchmarks/gpu_extras.sh
set -euo pipefail
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
[[ -d .gpu ]] || { echo "gpu_extras: run ../shared/gpu/pack.sh first" >&2; exit 2; }
tar -C "$site" -cf - --exclude='dm_control/locomotion' --exclude='dm_control/suite/dog_assets' \
  --exclude='dm_control/blender' --exclude='dm_control/manipulation' --exclude='__pycache__' \
  dm_control dm_env tree | xz -T0 -6 > .gpu/dm_control.tar.xz
echo "gpu_extras: .gpu/dm_control.tar.xz ($(du -m .gpu/dm_control.tar.xz | cut -f1) MiB); .gpu holds $(du -sm .gpu | cut -f1) MiB" >&2
