//! The scale benchmark's machinery (`cargo bench --bench scale`) at smoke size: 5 KCPs on one
//! single-member etcd, `quorumguard serve` as a child process. Functional facts only, no timing:
//! every KCP gets both conditions (from a probe: no ProbeFailed), a steady cycle writes no KCP status
//! and reads none, every review under load is answered (after the first cycle with a real decision),
//! and every KCP has one rollout prediction series, measured after the steady sweep.

use testkit::scale::{ScaleOptions, run, table};

#[test]
fn smoke_run_publishes_every_kcp_and_a_steady_cycle_writes_nothing() {
    // Its etcd clusters are started by the scale run itself: the slot (a blocking lock, taken
    // outside the runtime) keeps them the only ones running in this process, as every other
    // test's are.
    let _etcd = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(smoke_run());
}

async fn smoke_run() {
    let opts = ScaleOptions::smoke();
    let f = run(&opts, |_| {}).await.expect("the scale run");
    let report = table(&f);
    // A one-member etcd is up but cannot lose a member: every KCP says so, none ProbeFailed.
    assert_eq!(opts.members, 1);
    assert_eq!(
        f.quorum_reasons,
        [("NoFaultTolerance".to_string(), opts.kcps)].into(),
        "{report}"
    );
    assert_eq!(
        f.first_cycle_writes, opts.kcps,
        "one write per KCP: {report}"
    );
    assert_eq!(f.steady_writes, 0, "{report}");
    assert_eq!(f.steady_status_reads, 0, "{report}");
    let requests = f.idle.requests + f.sweeping.requests + f.first.requests;
    assert!(requests > 0, "{report}");
    for l in [&f.idle, &f.sweeping, &f.first] {
        assert_eq!(l.errors, 0, "{:?}\n{report}", l.first_error);
    }
    // Once published, health is known: real decisions (before the first probe, HealthUnknown
    // is the right answer).
    for l in [&f.idle, &f.sweeping] {
        assert!(
            l.verdicts
                .keys()
                .all(|k| !k.contains("NotHandled") && !k.contains("HealthUnknown")),
            "{:?}\n{report}",
            l.verdicts
        );
    }
    assert!(f.rss_hwm_kib > 0, "the guard's RSS is read from /proc");
    assert!(
        f.steady_sweep > std::time::Duration::ZERO,
        "the guard exports its sweep times: {report}"
    );
    // One member, one replica: the rollout finishes, but during it one more failure loses
    // quorum. One series per KCP, and the prediction's time is exported for the bench's ratio.
    assert_eq!(
        f.rollout_verdicts,
        [("unsafe FaultToleranceZero".to_string(), opts.kcps)].into(),
        "{report}"
    );
    assert!(
        f.steady_prediction > std::time::Duration::ZERO,
        "the guard exports its prediction times: {report}"
    );
    // The CLI over the same fleet says what serve's metric says, for every KCP.
    assert_eq!(
        f.cli_readiness,
        [("Unsafe FaultToleranceZero".to_string(), opts.kcps)].into(),
        "{report}"
    );
}
