#!/bin/bash
# onnxruntime-gpu for the GPU machine (issue 30's CUDA execution provider figures): its image has only the CPU
# onnxruntime. Run here, in the project root; it writes .gpu-ort/ (ignored): ort-gpu.tar.xz in parts and SHA256SUMS.
#   bash benchmarks/pack_ort_gpu.sh [VERSION] [PART_SIZE]      # default 1.30.0 (the image's CPU version), 8M
# PyPI's onnxruntime-gpu 1.27.0 and later are CUDA 13 builds, as the image's torch; the CUDA provider is cut to the
# H200's sm_90 code (benchmarks/slim_fatbin.py; SLIM=0 keeps all: 169 MiB, four calls), the C library and the
# TensorRT provider (no TensorRT on the image) are left out: 55.9 MiB. It cannot travel with .gpu/ (55 MiB): carry
# .gpu-ort in a second call to the same warm machine, whose command starts `source benchmarks/ort_gpu.sh &&`.
set -euo pipefail
VERSION=${1:-1.30.0}
PART=${2:-8M}
out=.gpu-ort
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$work" "onnxruntime-gpu==$VERSION"
unzip -q "$work"/onnxruntime_gpu-"$VERSION"-*.whl -d "$work/x"
capi="$work/x/onnxruntime/capi"
grep -q "cuda_version = '13" "$capi/build_and_package_info.py" || { echo "onnxruntime-gpu $VERSION is not a CUDA 13 build"; exit 1; }
if [ "${SLIM:-1}" = 1 ]; then
  python3 benchmarks/slim_fatbin.py "$capi/libonnxruntime_providers_cuda.so" "$work/provider.so" 90
  install -m 755 "$work/provider.so" "$capi/libonnxruntime_providers_cuda.so"
fi
rm -f "$capi"/libonnxruntime.so.* "$capi/libonnxruntime_providers_tensorrt.so"
rm -rf "$out" && mkdir -p "$out"
tar -C "$work/x" --owner=0 --group=0 -cf - onnxruntime "onnxruntime_gpu-$VERSION.dist-info" | xz -9 -T1 > "$out/ort-gpu.tar.xz"
(cd "$out" && sha256sum ort-gpu.tar.xz > SHA256SUMS && split -d -a 2 -b "$PART" ort-gpu.tar.xz ort-gpu.tar.xz.part- && rm ort-gpu.tar.xz)
du -sh "$out"
