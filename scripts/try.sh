#!/usr/bin/env bash
# The README's first quick-start command: quorumguard's main job on a local playground.
# Starts a real 3-member etcd cluster with TLS on 127.0.0.1, an API-server stand-in holding a
# Cluster API control plane, and quorumguard (webhook, prober, status publisher), then replays
# the cluster-api #2651 stuck upgrade (`--scenario NAME` picks another story, `--list` lists
# them, `--keep` leaves it running for kubectl). Installs what it needs from Debian first.
# Exit status: 0 when every expectation of the story held.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
cargo build --quiet --locked
exec target/debug/quorumguard playground "$@"
