#!/usr/bin/env bash
# Finds the real kube-apiserver for tests/slow/real_apiserver.rs the way controller-runtime's envtest
# does: KUBEBUILDER_ASSETS names a directory holding `kube-apiserver` and `etcd`.
#   - KUBEBUILDER_ASSETS already set (your own assets, e.g. setup-envtest's directory): kept.
#   - else, when ../shared/envtest/ beside the repository holds kube-apiserver-*-linux-amd64.xz:
#     its checksum is checked against SHA256SUMS there, it is unpacked once into
#     target/envtest/<name>/, Debian's etcd (scripts/deps.sh installs it) is linked beside it,
#     and KUBEBUILDER_ASSETS is exported.
#   - else nothing is set and those tests each print one line saying they are skipped; with
#     QUORUMGUARD_REQUIRE_ENVTEST set (.ci/run sets it) that is an error instead.
# Sourced by scripts/test.sh and .ci/run, from the repository root, after scripts/deps.sh.

qg_envtest_assets() {
  if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
    return 0
  fi
  local shared xz name dir
  shared="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/../shared/envtest"
  xz=$(ls "$shared"/kube-apiserver-*-linux-amd64.xz 2>/dev/null | sort | tail -n 1 || true)
  if [ -z "$xz" ]; then
    if [ -n "${QUORUMGUARD_REQUIRE_ENVTEST:-}" ]; then
      echo "quorumguard: KUBEBUILDER_ASSETS is not set and $shared has no kube-apiserver-*.xz" >&2
      return 1
    fi
    echo "quorumguard: no KUBEBUILDER_ASSETS and no $shared: the real kube-apiserver tests are skipped" >&2
    return 0
  fi
  name=$(basename "$xz" .xz)
  dir="$PWD/target/envtest/$name"
  if [ ! -x "$dir/kube-apiserver" ]; then
    if [ -f "$shared/SHA256SUMS" ]; then
      (cd "$shared" && grep " $(basename "$xz")\$" SHA256SUMS | sha256sum -c --quiet -) || {
        echo "quorumguard: $xz does not match $shared/SHA256SUMS" >&2
        return 1
      }
    fi
    mkdir -p "$dir"
    xz -dc "$xz" > "$dir/kube-apiserver.partial"
    chmod +x "$dir/kube-apiserver.partial"
    mv "$dir/kube-apiserver.partial" "$dir/kube-apiserver"
  fi
  ln -sfn "$(command -v etcd)" "$dir/etcd"
  export KUBEBUILDER_ASSETS="$dir"
}

qg_envtest_assets
