//! The world's unit tests.

use super::*;

#[test]
fn the_next_action_names_its_machine() {
    let c = Conditions {
        quorum: None,
        next_action: Some(Published {
            status: "True".into(),
            reason: "DeleteMachine".into(),
            message: "Machine default/demo-control-plane-7xk2p has a node but its etcd member is already gone. Run: kubectl delete machine -n default demo-control-plane-7xk2p".into(),
        }),
    };
    assert_eq!(c.action(), "DeleteMachine");
    assert_eq!(
        c.action_target().as_deref(),
        Some("demo-control-plane-7xk2p")
    );
    assert_eq!(Conditions::default().action_target(), None);
}
