//! The Machine deletion of the #2651 state (more Machines than replicas, one Machine's etcd
//! member already gone): the autopilot deletes that Machine as its own identity, through the API
//! server and so through quorumguard's webhook like any other requester, and only the object its
//! proof is about: the deletion carries the Machine's UID and resourceVersion as preconditions,
//! so a Machine recreated under the same name, or one changed since the probe, is not deleted
//! (the API server answers 409 and the autopilot decides again on the next probe).

use kube::api::{Api, DeleteParams, DynamicObject, Preconditions};
use kube::{Client, Error as KubeError};
use quorumguard_observe::state::Kind;
use quorumguard_observe::state::watch::api_resource;
use thiserror::Error;

/// The Machine an action deletes: where it is and which object it was when proven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
}

/// What a deletion did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// The API server accepted it: the Machine is deleting (its finalizers run next).
    Accepted,
    /// It was gone already (404): nothing to do.
    AlreadyGone,
}

/// Why a deletion did not happen. Each message names the Machine and what to do.
#[derive(Debug, Error)]
pub enum DeleteError {
    #[error(
        "Machine {namespace}/{name}: changed since it was proven memberless (the API server: \
         {message}); nothing was deleted: the autopilot decides again on the next probe"
    )]
    Changed {
        namespace: String,
        name: String,
        message: String,
    },
    #[error(
        "Machine {namespace}/{name}: the API server refused the deletion ({code} {reason}): \
         {message}"
    )]
    Refused {
        namespace: String,
        name: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error(
        "Machine {namespace}/{name}: the deletion got no answer ({error}); it may or may not \
         have been accepted: the next probe shows which"
    )]
    Unanswered {
        namespace: String,
        name: String,
        error: String,
    },
}

/// Deletes `machine` if it is still the object that was proven (UID and resourceVersion).
pub async fn delete_machine(client: &Client, machine: &MachineRef) -> Result<Deleted, DeleteError> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &machine.namespace,
        &api_resource(Kind::Machine),
    );
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(machine.uid.clone()),
            resource_version: Some(machine.resource_version.clone()),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&machine.name, &params).await {
        Ok(_) => Ok(Deleted::Accepted),
        Err(KubeError::Api(status)) if status.code == 404 => Ok(Deleted::AlreadyGone),
        Err(KubeError::Api(status)) if status.code == 409 => Err(DeleteError::Changed {
            namespace: machine.namespace.clone(),
            name: machine.name.clone(),
            message: status.message,
        }),
        Err(KubeError::Api(status)) => Err(DeleteError::Refused {
            namespace: machine.namespace.clone(),
            name: machine.name.clone(),
            code: status.code,
            reason: status.reason,
            message: status.message,
        }),
        Err(e) => Err(DeleteError::Unanswered {
            namespace: machine.namespace.clone(),
            name: machine.name.clone(),
            error: e.to_string(),
        }),
    }
}
