#!/usr/bin/env bash
# Installs what quorumguard's build and tests need from Debian, when missing:
#   etcd-server (etcd 3.4, real etcd for tests), etcd-client (etcdctl), protobuf-compiler
#   (protoc, which the etcd-client crate runs at build time) and libprotobuf-dev (the
#   well-known .proto files protoc imports; only a recommendation of protobuf-compiler, so
#   --no-install-recommends alone leaves them out and the etcd-client build fails),
#   prometheus for its promtool (tests/monitoring.rs checks and unit-tests the alerts of
#   manifests/monitoring/; the tests run only promtool, never the server, which Debian's
#   container images keep from starting at install with their policy-rc.d), and xz-utils to
#   unpack the real kube-apiserver (scripts/envtest.sh).
# Sourced by scripts/try.sh, scripts/test.sh and .ci/run.
set -euo pipefail

# What building the binary needs (the etcd-client crate runs protoc at build time, and protoc
# needs the well-known .proto files). The Dockerfile's build stage installs the same packages:
# tests/dockerfile.rs holds it to this list.
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

qg_install_deps
