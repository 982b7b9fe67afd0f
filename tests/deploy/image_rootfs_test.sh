#!/usr/bin/env bash
# The images' runtime stages, checked without a container engine: each one is
# built as a root filesystem (mmdebstrap: Debian 12 with the packages the
# stage installs), the Dockerfile's last stage is applied to it
# (dockerfile_stage.py: its RUN lines run in the root, its COPY --from=build
# takes the local build's binaries), and then, as the image's user, inside
# the root: every binary's --help, ldd finds every library, the controller
# starts as the ENTRYPOINT and the HEALTHCHECK command reports SERVING, and
# wsync-demo runs a controller and two host workers syncing two versions
# with every destination byte verified. The host image's build stage is
# applied to a root with docker/build-packages.txt as far as configuring the
# project (cmake for real, ninja as a dry run over the four targets).
#   Dockerfile            host image: Debian 12 + docker/runtime-packages.txt, BUILD_DIR's binaries
#   docker/Dockerfile.gpu GPU image, when GPU_BUILD_DIR holds the CUDA build
#                         (scripts/gpu_run.sh build, or the four binaries):
#                         its base, NVIDIA's CUDA runtime image, cannot be made
#                         here (NVIDIA's apt repository is unreachable), so a
#                         Debian 12 minimal root with libcudart and NCCL from
#                         the local CUDA toolkit stands in for it; the binaries
#                         and their libraries come as docker/bundle_libs.sh
#                         bundles them. No GPU here: the sync runs on the host plane.
# usage: image_rootfs_test.sh BUILD_DIR [GPU_BUILD_DIR]
# Skips (exit 0, "SKIPPED: <reason>") without root, mmdebstrap, mount
# namespaces or a reachable Debian mirror ($WSYNC_DEBIAN_MIRROR). Root
# filesystems are cached by package list in
# ${WSYNC_DEPLOY_TOOLS:-~/.cache/wsync-deploy-tools}/rootfs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
self="$here/$(basename "$0")"
src=$(cd "$here/../.." && pwd)
mirror=${WSYNC_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${WSYNC_DEPLOY_TOOLS:-$HOME/.cache/wsync-deploy-tools}/rootfs
cuda=${CUDA_HOME:-/usr/local/cuda}
bins="wsync-controller wsync-worker wsyncctl wsync-demo"

skip() { echo "SKIPPED: $*"; exit 0; }
fail() { echo "FAILED: $*"; exit 1; }

# Inside the private mount namespace: one image.
inside() {
  local root=$1 name=$2 dockerfile=$3 tar=$4 cuda_libs=$5
  shift 5
  mount -t tmpfs -o size=3g tmpfs "$root" || fail "tmpfs for the root"
  tar -xf "$tar" -C "$root" || fail "unpacking $tar"
  mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" &&
    mount -t tmpfs tmpfs "$root/dev/shm" && mount -t tmpfs tmpfs "$root/tmp" ||
    fail "mounts in $root"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  if [ "$cuda_libs" = 1 ]; then
    mkdir -p "$root/usr/local/cuda/lib64"
    cp -a "$cuda"/lib64/libcudart.so* "$cuda"/lib64/libnccl.so* "$root/usr/local/cuda/lib64/"
  fi
  local config
  config=$(python3 "$here/dockerfile_stage.py" "$dockerfile" --root "$root" --context "$src" "$@") ||
    fail "$name: applying $(basename "$dockerfile")'s last stage"
  get() { python3 -c 'import json,sys; c=json.loads(sys.argv[1]); v=c
for k in sys.argv[2].split("."): v=v[k]
print(" ".join(v) if isinstance(v, list) else v)' "$config" "$1"; }
  local user entrypoint healthcheck ld
  user=$(get user) entrypoint=$(get entrypoint) healthcheck=$(get healthcheck)
  ld=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["env"].get("LD_LIBRARY_PATH",""))' "$config")
  echo "$name: base $(get base), user $user, entrypoint $entrypoint"
  [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] || fail "$name runs as root"
  as_user() {
    chroot --userspec="$user" "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin \
      HOME=/var/lib/wsync LD_LIBRARY_PATH="$ld" "$@"
  }
  local b out
  for b in $bins; do
    out=$(as_user /usr/bin/ldd "/usr/local/bin/$b" 2>&1)
    grep -q "not found" <<<"$out" && fail "$name: $b misses libraries: $(grep 'not found' <<<"$out")"
    out=$(as_user "/usr/local/bin/$b" --help 2>&1)
    local rc=$?
    [ $rc -le 1 ] && grep -qE "Flags from|usage:" <<<"$out" || fail "$name: $b --help (exit $rc): $out"
  done
  echo "$name: --help of $bins; ldd finds every library"
  # The controller as the image runs it, and the HEALTHCHECK against it.
  local controller="/usr/local/bin/wsync-controller"
  [ -n "$entrypoint" ] && [ "$(basename "${entrypoint%% *}")" = wsync-controller ] && controller=$entrypoint
  as_user $controller --insecure --listen=127.0.0.1:0 --metrics_port=0 \
    --port_file=/tmp/controller.ports --state_file=/var/lib/wsync/controller.state \
    >"$root/tmp/controller.log" 2>&1 &
  local pid=$! port=""
  for _ in $(seq 100); do
    port=$(sed -n 's/^grpc_port=//p' "$root/tmp/controller.ports" 2>/dev/null)
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { kill "$pid"; fail "$name: controller did not start: $(cat "$root/tmp/controller.log")"; }
  local check=${healthcheck:-/usr/local/bin/wsyncctl health --controller=127.0.0.1:$port}
  out=$(as_user WSYNC_HEALTH_ADDRESS="127.0.0.1:$port" /bin/sh -c "$check" 2>&1)
  local health_rc=$?
  kill "$pid"
  wait "$pid" 2>/dev/null
  [ $health_rc = 0 ] && grep -q SERVING <<<"$out" || fail "$name: health check '$check': $out"
  as_user /usr/bin/test -w /var/lib/wsync || fail "$name: user $user cannot write /var/lib/wsync (--state_file)"
  echo "$name: controller started as $user, health check: $out"
  out=$(as_user /usr/local/bin/wsync-demo --model tiny-llama --source fsdp:1 --destination vllm-tp:1 \
    --versions 2 --controller_bin=/usr/local/bin/wsync-controller \
    --worker_bin=/usr/local/bin/wsync-worker --work_dir=/tmp/demo 2>&1)
  grep -q "OK: every destination byte verified" <<<"$out" ||
    fail "$name: controller + 2 workers sync: $out $(cat "$root"/tmp/demo/*.log 2>/dev/null | tail -40)"
  echo "$name: controller + 2 host workers synced 2 versions, every destination byte verified"
}

# Inside the private mount namespace: the host image's build stage on a root
# with docker/build-packages.txt; its RUN lines configure the project for real
# and ask ninja (dry run) for the four targets: the package list is complete.
inside_build() {
  local root=$1 dockerfile=$2 tar=$3
  mount -t tmpfs -o size=4g tmpfs "$root" || fail "tmpfs for the build root"
  tar -xf "$tar" -C "$root" || fail "unpacking $tar"
  mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" && mount -t tmpfs tmpfs "$root/tmp" ||
    fail "mounts in $root"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  python3 "$here/dockerfile_stage.py" "$dockerfile" --stage build --ninja_dry_run --root "$root" \
    --context "$src" >/dev/null || fail "host build stage"
  local leaked
  leaked=$(cd "$root/src" && ls -d .git build* .devbundle 2>/dev/null)
  [ -z "$leaked" ] || fail "the build context carries $leaked (.dockerignore)"
  echo "host build stage: docker/build-packages.txt configures the project and its four targets;" \
    "context of $(find "$root/src" -type f | wc -l) files without build trees or .git"
}

if [ "${1:-}" = --inside-build ]; then
  shift
  inside_build "$@"
  exit $?
fi
if [ "${1:-}" = --inside ]; then
  shift
  inside "$@"
  exit $?
fi

build=$(cd "${1:?usage: $0 BUILD_DIR [GPU_BUILD_DIR]}" && pwd)
gpu_build=${2:-$src/build-gpu}
[ "$(id -u)" = 0 ] || skip "needs root (chroot and a mount namespace)"
command -v mmdebstrap >/dev/null || skip "mmdebstrap missing (scripts/install_deploy_tools.sh installs it)"
unshare -m true 2>/dev/null || skip "cannot create a mount namespace (unshare -m)"
host=${mirror#*://}
host=${host%%/*}
timeout 15 bash -c "exec 3<>/dev/tcp/$host/80" 2>/dev/null || skip "Debian mirror $mirror unreachable"

# A cached Debian 12 minbase root with the given packages.
rootfs() {
  local key tar
  key=$(printf '%s\n' bookworm "$mirror" "$@" | md5sum | cut -c1-16)
  tar=$cache/bookworm-$key.tar
  if [ ! -s "$tar" ]; then
    mkdir -p "$cache"
    local include=()
    [ $# -gt 0 ] && include=(--include="$(IFS=,; echo "$*")")
    mmdebstrap --quiet --variant=minbase --format=tar "${include[@]}" bookworm \
      "$cache/partial-$key.tar" "$mirror" >&2 || fail "mmdebstrap of Debian 12 with: $*"
    mv "$cache/partial-$key.tar" "$tar"
  fi
  echo "$tar"
}

for b in controller/server/wsync-controller worker/agent/wsync-worker tools/wsyncctl tools/demo/wsync-demo; do
  [ -x "$build/$b" ] || fail "$build/$b missing: build it first"
done
tar=$(rootfs $(grep -v '^#' "$src/docker/build-packages.txt")) || exit 1
# In a private mount namespace: its mounts go with it, the empty mount point stays.
in_namespace() {
  local mnt rc
  mnt=$(mktemp -d /tmp/wsync-root-XXXXXX)
  unshare -m --fork bash "$self" "$1" "$mnt" "${@:2}"
  rc=$?
  rmdir "$mnt"
  return $rc
}
in_namespace --inside-build "$src/Dockerfile" "$tar" || exit 1
tar=$(rootfs $(grep -v '^#' "$src/docker/runtime-packages.txt")) || exit 1
in_namespace --inside host "$src/Dockerfile" "$tar" 0 --map "/build=$build" || exit 1

gpu_bins=()
for b in controller/server/wsync-controller worker/agent/wsync-worker tools/wsyncctl tools/demo/wsync-demo; do
  [ -x "$gpu_build/$b" ] && gpu_bins+=("$gpu_build/$b")
done
if [ ${#gpu_bins[@]} != 4 ] || ! grep -q "WSYNC_WITH_CUDA:BOOL=ON" "$gpu_build/CMakeCache.txt" 2>/dev/null; then
  echo "gpu: SKIPPED: no CUDA build of the four binaries in $gpu_build (scripts/gpu_run.sh build)"
  exit 0
fi
[ -d "$cuda/lib64" ] || { echo "gpu: SKIPPED: no CUDA toolkit at $cuda for libcudart / NCCL"; exit 0; }
echo "gpu: NVIDIA's apt repository and CUDA images are unreachable here: a Debian 12 minimal root" \
  "with libcudart and NCCL from $cuda stands in for nvidia/cuda:*-runtime-ubuntu24.04"
bundle=$(mktemp -d /tmp/wsync-bundle-XXXXXX)
trap 'rm -rf "$bundle"' EXIT
bash "$src/docker/bundle_libs.sh" "$bundle/opt" "${gpu_bins[@]}" || fail "docker/bundle_libs.sh"
tar=$(rootfs) || exit 1
in_namespace --inside gpu "$src/docker/Dockerfile.gpu" "$tar" 1 --map "/opt/wsync/=$bundle/opt/" || exit 1
