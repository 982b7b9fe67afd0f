#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the local demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
build=${WSYNC_BUILD_DIR:-build}
if [ -x "$build/tools/demo/wsync-demo" ]; then
  exec "$build/tools/demo/wsync-demo" "$@"
fi
exec "$build/tools/wsyncctl" plan --model llama3-8b --source fsdp:8 --destination vllm-tp:2x4
