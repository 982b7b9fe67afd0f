#!/usr/bin/env bash
# Installs the Debian 12 packages wsync builds and tests with (idempotent).
set -euo pipefail
pkgs=(cmake ninja-build g++ ccache pkg-config
      lld  # links the test binaries about 3 x faster than ld.bfd (CMakeLists.txt)
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev prometheus-cpp-dev
      libgloo-dev libspdlog-dev libcli11-dev prometheus python3 zlib1g-dev
      openssl  # the TLS tests make their certificates with it
      # sanitizer and libFuzzer builds (scripts/sanitize.sh, scripts/fuzz.sh)
      clang llvm libclang-rt-dev
      # the Python package (python/): Debian's /usr/bin/python3 and its modules
      python3-dev pybind11-dev python3-grpcio python3-protobuf python3-pytest
      python3-pytest-asyncio python3-torch python3-setuptools python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# helm, kubectl, the Kubernetes schemas and mmdebstrap for tests/deploy/
# (cached; without network the deployment checks skip).
bash "$(dirname "$0")/install_deploy_tools.sh"
