//! The load generator of `cargo bench --bench webhook_load` in its smoke mode (1 s, concurrency
//! 4): both servers answer every review with a valid allowed or denied AdmissionReview, uid
//! echoed, and nothing fails. No timing is asserted: the figures are the benchmark's.

use testkit::load::{Servers, Target, smoke};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_smoke_run_has_no_errors() {
    let servers = Servers::start().await.expect("servers start");
    let opts = smoke();
    for target in [Target::Floor, Target::Quorumguard] {
        let r = servers.drive(target, &opts).await.expect("drives");
        assert_eq!(r.errors, 0, "{target:?}: {:?}", r.first_error);
        assert!(r.requests > 0, "{target:?}: no request measured");
        if target == Target::Quorumguard {
            // Real decisions, not "not handled" or "unknown health".
            assert!(
                r.verdicts
                    .keys()
                    .all(|k| !k.contains("NotHandled") && !k.contains("HealthUnknown")),
                "{:?}",
                r.verdicts
            );
            assert!(
                r.verdicts.keys().any(|k| k.starts_with("denied/")),
                "{:?}",
                r.verdicts
            );
        }
    }
    servers.shutdown().await;
}
