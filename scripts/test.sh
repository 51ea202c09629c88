#!/usr/bin/env bash
# The whole test suite: installs what it needs from Debian, then runs every test
# (engine, CLI on real-etcd fixtures, integration tests with real etcd on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
cargo test --locked "$@"
