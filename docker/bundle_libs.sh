#!/usr/bin/env bash
# Copies executables and the shared libraries they load into OUT/bin and
# OUT/lib, leaving out what the CUDA runtime base image provides itself (the
# C and C++ runtimes, the CUDA driver and runtime, NCCL). The GPU image
# (docker/Dockerfile.gpu) builds on Debian 12, the machine type the GPU build
# is made and tested on (scripts/gpu_run.sh), and runs on NVIDIA's Ubuntu
# CUDA runtime image: the Debian libraries travel with the binaries, and
# LD_LIBRARY_PATH names OUT/lib. tests/deploy/image_rootfs_test.sh uses the
# same script.
# usage: bundle_libs.sh OUT EXECUTABLE...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT EXECUTABLE..." >&2; exit 2; }
out=$1
shift
mkdir -p "$out/bin" "$out/lib"
provided='/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcudart|libnccl|libnvidia[^/]*)\.so'
for exe in "$@"; do
  cp -L "$exe" "$out/bin/"
  ldd "$exe" | awk '/=> \//{print $3}' | { grep -Ev "$provided" || true; } | while read -r lib; do
    cp -Ln "$lib" "$out/lib/"
  done
  if ldd "$exe" | grep -q 'not found'; then
    echo "bundle_libs: $exe needs a library this machine lacks:" >&2
    ldd "$exe" | grep 'not found' >&2
    exit 1
  fi
done
