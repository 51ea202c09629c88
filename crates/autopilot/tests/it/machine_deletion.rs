//! The #2651 Machine deletion against the API-server stand-in: only the object proven is
//! deleted (UID and resourceVersion preconditions), a gone Machine is no error, and each refusal
//! names the Machine and what happens next.

use kube::ResourceExt;
use quorumguard_autopilot::{DeleteError, Deleted, MachineRef, delete_machine};
use serde_json::json;
use testkit::kit::{NS, create, machine, machines, merge, patch, setup};

fn proven(m: &kube::api::DynamicObject) -> MachineRef {
    MachineRef {
        namespace: NS.into(),
        name: m.name_any(),
        uid: m.uid().expect("a uid"),
        resource_version: m.resource_version().expect("a resourceVersion"),
    }
}

#[tokio::test]
async fn the_machine_proven_is_deleted_and_a_gone_one_is_no_error() {
    let (_server, client) = setup().await;
    let api = machines(&client);
    let m = create(&api, &machine("cp-1", json!({}))).await;
    let r = proven(&m);
    assert_eq!(
        delete_machine(&client, &r).await.expect("deleted"),
        Deleted::Accepted
    );
    assert!(api.get_opt("cp-1").await.expect("get").is_none());
    assert_eq!(
        delete_machine(&client, &r).await.expect("gone is fine"),
        Deleted::AlreadyGone
    );
}

#[tokio::test]
async fn a_machine_changed_or_recreated_since_the_proof_is_not_deleted() {
    let (_server, client) = setup().await;
    let api = machines(&client);
    let m = create(&api, &machine("cp-1", json!({}))).await;
    let r = proven(&m);
    // Changed since the proof (a label added): another resourceVersion.
    patch(
        &api,
        "cp-1",
        &merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await;
    let err = delete_machine(&client, &r).await.expect_err("changed");
    assert!(matches!(err, DeleteError::Changed { .. }), "{err}");
    assert!(err.to_string().contains("default/cp-1"), "{err}");
    assert!(api.get_opt("cp-1").await.expect("get").is_some());
    // Deleted and recreated under the same name: another UID.
    api.delete("cp-1", &Default::default())
        .await
        .expect("delete");
    let again = create(&api, &machine("cp-1", json!({}))).await;
    assert_ne!(again.uid(), m.uid());
    let err = delete_machine(&client, &r).await.expect_err("recreated");
    assert!(matches!(err, DeleteError::Changed { .. }), "{err}");
    assert!(api.get_opt("cp-1").await.expect("get").is_some());
}
