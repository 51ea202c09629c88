#!/usr/bin/env bash
# The whole test suite: installs what it needs from Debian, then runs every test
# (engine, CLI on real-etcd fixtures, integration tests with real etcd on loopback, and the
# real kube-apiserver tests when KUBEBUILDER_ASSETS is set or ../shared/envtest/ has one: see
# scripts/envtest.sh).
#
# With arguments, they go to `cargo test --locked --workspace` as they are
# (`scripts/test.sh --test it docs::`). Without, every test in two steps, each binary built
# once beforehand:
#   1. two lanes at once: the slow real-process tests (tests/slow: playground stories, the real
#      kube-apiserver, the model check), and every other binary but leader_changes (each crate's
#      unit tests and tests/it, the root's tests/it; no crate has doc tests). The slow tests wait
#      on etcd and on timeouts far more than they compute (load average ~1.3 of 2 cores when they
#      ran alone); each test process runs one etcd cluster at a time and the machine two
#      (testkit's slots), so the two lanes run at most two.
#   2. tests/leader_changes alone: it needs the machine to itself (docs/development.md).
# The slow lane's output is printed when it ends (in full if it failed).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
source scripts/envtest.sh
if [ "$#" -gt 0 ]; then
  exec cargo test --locked --workspace "$@"
fi

cargo test --locked --workspace --no-run
slow_log=$(mktemp -t quorumguard-slow-lane.XXXXXX)
started=$SECONDS
cargo test --locked --workspace --test slow >"$slow_log" 2>&1 &
slow_pid=$!
set +e
cargo test --locked --workspace --lib --bins --test it
others=$?
echo "quorumguard: every binary but tests/slow and tests/leader_changes took $((SECONDS - started)) s (rc $others)" >&2
wait "$slow_pid"
slow=$?
set -e
echo "== tests/slow (ran beside the others; rc $slow, $((SECONDS - started)) s since both started)"
if [ "$slow" -eq 0 ]; then
  grep -E '^(running|test result|test .* \.\.\. (ok|ignored))' "$slow_log" || true
else
  cat "$slow_log"
fi
rm -f "$slow_log"
if [ "$others" -ne 0 ] || [ "$slow" -ne 0 ]; then
  exit 1
fi
cargo test --locked --workspace --test leader_changes
