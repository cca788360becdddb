#!/usr/bin/env bash
# Adds to .gpu/ (made by ../shared/gpu/pack.sh) what a GPU run needs and pack.sh leaves out, as .gpu/extras.tar.xz,
# unpacked by .gpu/env.sh after pack.sh's own site:
# - the `full` extra's packages: pack.sh walks robotloop's base requirements only, and since the slim robot
#   install those hold no lerobot, torch or services (pyproject.toml);
# - dm_control for lerobot-eval (gym-aloha imports it; pack.sh skips it): 116 MB installed, mostly locomotion and
#   dog assets ALOHA never loads, so without them.
#   ../shared/gpu/pack.sh && bash benchmarks/gpu_extras.sh
set -euo pipefail
py=${1:-.venv/bin/python}
pack=$(dirname "$0")/../../shared/gpu/pack.sh
[[ -f .gpu/specs.txt && -f $pack ]] || { echo "gpu_extras: run ../shared/gpu/pack.sh first" >&2; exit 2; }
image=$(sed -n 's/^image="\(.*\)"$/\1/p' "$pack")
rm -rf .gpu/extras && mkdir -p .gpu/extras/wheels
# The same walk as pack.sh's, from robotloop[full], less what the image or pack.sh's site already hold.
"$py" - "$image" .gpu/specs.txt > .gpu/extras/specs.txt <<'PY'
import re, sys
from importlib.metadata import PackageNotFoundError, distribution
from packaging.requirements import Requirement
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {norm(n) for n in sys.argv[1].split(",")} - {"hf-xet"}
packed = {norm(line.split("==")[0]) for line in open(sys.argv[2]) if line.strip()}
skip = {"strands-agents", "dm-control", "imageio-ffmpeg"}  # as pack.sh: not needed for GPU runs
seen, todo, out = set(), [("robotloop", ("full",))], []
while todo:
    name, extras = todo.pop()
    name = norm(name)
    if (name, extras) in seen or name in skip:
        continue
    seen.add((name, extras))
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        continue
    if name != "robotloop" and name not in image and name not in packed:
        out.append(f"{dist.metadata['Name']}=={dist.version}")
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (extras or ("",))):
            continue
        todo.append((req.name, tuple(sorted(req.extras))))
print("\n".join(sorted(set(out))))
PY
if [[ -s .gpu/extras/specs.txt ]]; then
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/extras/wheels -r .gpu/extras/specs.txt 2>&1 | grep -v '^WARNING' || true
  "$py" -m pip install -q --no-index --no-deps --no-compile --target .gpu/extras/site .gpu/extras/wheels/*.whl
fi
mkdir -p .gpu/extras/site
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
tar -C "$site" -cf - --exclude='dm_control/locomotion' --exclude='dm_control/suite/dog_assets' \
  --exclude='dm_control/blender' --exclude='dm_control/manipulation' --exclude='__pycache__' \
  dm_control dm_env tree | tar -C .gpu/extras/site -xf -
(cd .gpu/extras && tar -cf - site | xz -T0 -6 > ../extras.tar.xz)
cp .gpu/extras/specs.txt .gpu/extras-specs.txt && rm -rf .gpu/extras
grep -q extras.tar.xz .gpu/env.sh || sed -i 's|^\[ -d /tmp/site \] .*|&\n[ -f .gpu/extras.tar.xz ] \&\& [ ! -d /tmp/site/lerobot ] \&\& tar -xJf .gpu/extras.tar.xz -C /tmp|' .gpu/env.sh
echo "gpu_extras: $(wc -l < .gpu/extras-specs.txt) packages and dm_control in .gpu/extras.tar.xz ($(du -m .gpu/extras.tar.xz | cut -f1) MiB); .gpu holds $(du -sm .gpu | cut -f1) MiB" >&2
