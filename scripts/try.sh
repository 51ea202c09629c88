#!/usr/bin/env bash
# The README's first quick-start command: quorumguard's main job on an example.
# Judges the cluster-api #2651 state (a rollout interrupted after the old member was removed)
# from real kubectl/etcdctl dumps, offline. Installs what it needs from Debian first.
# (The playground, a live replay with real etcd and the webhook, will take its place.)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ex=examples/stuck-upgrade
cargo run --quiet --locked -- check \
  --objects "$ex/objects.yaml" \
  --member-list "$ex/member-list.json" \
  --endpoint-status "$ex/endpoint-status.json" \
  --endpoint-health "$ex/endpoint-health.json" \
  --what-if 'delete machine/demo-control-plane-x7k2p' \
  --what-if 'delete machine/demo-control-plane-m4q8z' \
  --what-if 'scale kcp/demo-control-plane 5' \
  "$@" || status=$?
status=${status:-0}
# Exit 1 means "a what-if was denied", which is part of the story here; 2 is bad input.
if [ "$status" -ge 2 ]; then exit "$status"; fi
