#!/usr/bin/env bash
# The whole test suite: installs what it needs from Debian, then runs every test
# (engine, CLI on real-etcd fixtures, integration tests with real etcd on loopback, and the
# real kube-apiserver tests when KUBEBUILDER_ASSETS is set or ../shared/envtest/ has one: see
# scripts/envtest.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
source scripts/envtest.sh
cargo test --locked --workspace "$@"
