#!/usr/bin/env bash
# Packs what issue 31's GPU-machine figures need beyond ../shared/gpu/pack.sh's .gpu/: Ray's core (the venv's ray
# without its dashboard client, Java jars and libraries: RLlib, Serve, Data, Train, Tune; binaries stripped of
# their symbols) with the dependencies the image lacks, and a PostgreSQL server (the `pgserver` wheel's
# self-contained build: it needs only libc and zlib, where Debian's packages would need the image's ICU, LDAP and
# OpenSSL at Debian's versions). About 29 MiB: too much to travel with .gpu/ (64 MiB in all), so it goes in the
# next call to the same warm machine. That machine does not keep .gpu/ itself (a call's carry replaces the last's),
# but keeps what .gpu/env.sh unpacked: /tmp/site and the EGL loaders (seen 2026-12-05).
#
#   ../shared/gpu/pack.sh && bash benchmarks/pack_cluster.sh      # here, after make install
#   device run 1: carry [".gpu"],         command: source .gpu/env.sh && <anything, or true>
#   device run 2 (within 30 s): carry [".gpu-cluster"], command:
#     source .gpu-cluster/env.sh && \
#     (setsid nohup bash benchmarks/h200_cluster.sh /tmp/cl > /tmp/cl.log 2>&1 &) && sleep 20 && \
#     bash benchmarks/device_follow.sh /tmp/cl 540
set -euo pipefail
py=$PWD/.venv/bin/python
[[ -x $py ]] || { echo "pack_cluster: no $py (run make install first)" >&2; exit 2; }
site=$("$py" -c 'import ray, pathlib; print(pathlib.Path(ray.__file__).parents[1])')
grep -qsx '/.gpu-cluster/' .git/info/exclude || echo '/.gpu-cluster/' >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf .gpu-cluster && mkdir -p .gpu-cluster "$work/site"
# Ray and the packages it needs that the image lacks (the image's list: ../shared/gpu/pack.sh).
names=(ray jsonschema jsonschema_specifications referencing rpds)
dists=$(cd "$site" && ls -d ray-*.dist-info jsonschema-*.dist-info jsonschema_specifications-*.dist-info \
  referencing-*.dist-info rpds_py-*.dist-info)
(cd "$site" && tar -cf - --exclude=__pycache__ --exclude='*.js.map' --exclude=ray/jars --exclude=ray/rllib \
  --exclude=ray/serve --exclude=ray/data --exclude=ray/train --exclude=ray/tune --exclude=ray/llm \
  --exclude=ray/workflow --exclude=ray/dashboard/client "${names[@]}" $dists) |
  tar -xf - -C "$work/site"
strip --strip-unneeded "$work/site/ray/_raylet.so" "$work/site/ray/core/src/ray/gcs/gcs_server" \
  "$work/site/ray/core/src/ray/raylet/raylet"
# PostgreSQL: the server, initdb and pg_ctl with their libraries and share/ (no headers, no client tools).
"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 -d "$work/wheel" "pgserver==0.1.4" 2>&1 | { grep -v "^WARNING" || true; }
(cd "$work" && "$py" -m zipfile -e wheel/pgserver-*.whl wheel/x)
# initdb finds libpq through its RPATH ($ORIGIN/../../../pgserver.libs): the wheel's layout is kept.
install=pg/pgserver/pginstall
mkdir -p "$work/$install/bin"
cp -a "$work"/wheel/x/pgserver.libs "$work/pg/"
cp -a "$work"/wheel/x/pgserver/pginstall/{lib,share} "$work/$install/"
cp -a "$work"/wheel/x/pgserver/pginstall/bin/{postgres,initdb,pg_ctl} "$work/$install/bin/"
chmod -R a+rX "$work/pg" && chmod a+x "$work/$install"/bin/*  # the zip kept no modes; root runs it as nobody
(cd "$work" && tar -cf - site pg | xz -T0 -6 > "$OLDPWD/.gpu-cluster/cluster.tar.xz")
cat > .gpu-cluster/env.sh <<'SH'
# Sourced on a machine where .gpu/env.sh ran before (its /tmp/site and EGL loaders stay there): Ray's core and a
# PostgreSQL server, unpacked to /tmp/cluster (about 10 s), and .gpu/env.sh's environment again.
[ -d /tmp/cluster ] || { mkdir -p /tmp/cluster && tar -xJf .gpu-cluster/cluster.tar.xz -C /tmp/cluster; }
export PYTHONPATH=/tmp/cluster/site:/tmp/site:$PWD PATH=/tmp/cluster/pg/pgserver/pginstall/bin:$PATH \
  PYTHONUNBUFFERED=1 HF_HUB_DISABLE_TELEMETRY=1 MUJOCO_GL=egl \
  __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json \
  VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
SH
echo "pack_cluster: .gpu-cluster/ ($(du -sm .gpu-cluster | cut -f1) MiB)" >&2
