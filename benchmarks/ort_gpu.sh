# Sourced on the GPU machine after `source .gpu/env.sh` (an earlier call of the same lease may have done that):
# gathers the parts of .gpu-ort/ that this call carried into /tmp/ortgpu (parts stay there between calls of one
# lease), unpacks onnxruntime-gpu once all are there and their checksum holds, and puts it first on PYTHONPATH with
# the image's CUDA 13 libraries on LD_LIBRARY_PATH. Prints ORT_GPU_READY or ORT_GPU_MISSING_PARTS.
mkdir -p /tmp/ortgpu/parts
cp -n .gpu-ort/SHA256SUMS .gpu-ort/ort-gpu.tar.xz.part-* /tmp/ortgpu/parts/ 2>/dev/null
if [ ! -d /tmp/ortgpu/site/onnxruntime ]; then
  (cd /tmp/ortgpu/parts && cat ort-gpu.tar.xz.part-* > ort-gpu.tar.xz && sha256sum -c --quiet SHA256SUMS &&
    mkdir -p /tmp/ortgpu/site && tar -xJf ort-gpu.tar.xz -C /tmp/ortgpu/site); rm -f /tmp/ortgpu/parts/ort-gpu.tar.xz
fi
if [ -d /tmp/ortgpu/site/onnxruntime ]; then
  nvidia_libs=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia
  export PYTHONPATH=/tmp/ortgpu/site:${PYTHONPATH:-} \
    LD_LIBRARY_PATH=$nvidia_libs/cu13/lib:$nvidia_libs/cudnn/lib:${LD_LIBRARY_PATH:-}
  echo ORT_GPU_READY
else
  echo "ORT_GPU_MISSING_PARTS: $(ls /tmp/ortgpu/parts | tr '\n' ' ')"
fi
