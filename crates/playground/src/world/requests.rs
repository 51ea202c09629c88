//! The writes people and controllers make in the world, through the API and so through the
//! webhook: Machines created, given a node, deleted and annotated; the KCP patched and scaled.

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::objects::{kcp_uid, machine_object};
use super::{KCP, MACHINE_CONTROLLER, NAMESPACE, World, WorldError, kcp_controller};
use crate::apiserver::{kcp_resource, machine_resource};

impl World {
    /// Creates a control-plane Machine `name` as KCP does: no node yet ([`World::set_node`]
    /// gives it one once its member has joined).
    pub async fn create_machine(&self, name: &str, version: &str) -> Result<(), WorldError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client_as(kcp_controller())?,
            NAMESPACE,
            &machine_resource(),
        );
        let object: DynamicObject =
            serde_json::from_value(machine_object(name, version, &kcp_uid(&self.api))).map_err(
                |e| WorldError::Other(format!("building Machine {NAMESPACE}/{name}: {e}")),
            )?;
        let written = api.create(&Default::default(), &object).await;
        self.machine_written(written, || format!("creating Machine {NAMESPACE}/{name}"))
            .await
    }

    /// Sets Machine `name`'s node to its own name (node == member name), as the Machine
    /// controller does once the node has joined.
    pub async fn set_node(&self, name: &str) -> Result<(), WorldError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client_as(MACHINE_CONTROLLER)?,
            NAMESPACE,
            &machine_resource(),
        );
        let status = json!({"status": {"nodeRef": {"name": name}, "phase": "Running"}});
        let written = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await;
        self.machine_written(written, || {
            format!("setting Machine {NAMESPACE}/{name}'s node")
        })
        .await
    }

    /// Deletes Machine `name` as `user` through the API (and so through the webhook). `Ok(Err)`
    /// is the API server's refusal: its HTTP code and message.
    pub async fn delete_machine(&self, name: &str, user: &str) -> Answer {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client_as(user)?, NAMESPACE, &machine_resource());
        let result = api.delete(name, &DeleteParams::background()).await;
        // Left: still there, deleting (its finalizers hold it); right: gone at once.
        let written = result.as_ref().ok().and_then(|e| e.as_ref().left());
        self.api
            .seen(&machine_resource(), written.map(|o| &o.metadata))
            .await?;
        answer(result, || format!("deleting Machine {NAMESPACE}/{name}"))
    }

    /// Merge-patches the KCP's spec as `user` (through the webhook); `Ok(Err)` as for
    /// [`World::delete_machine`].
    pub async fn patch_kcp_spec(&self, spec: Value, user: &str) -> Answer {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client_as(user)?, NAMESPACE, &kcp_resource());
        let patch = Patch::Merge(json!({ "spec": spec }));
        let result = api.patch(KCP, &PatchParams::default(), &patch).await;
        self.api
            .seen(&kcp_resource(), result.as_ref().ok().map(|o| &o.metadata))
            .await?;
        answer(result, || {
            format!("updating KubeadmControlPlane {NAMESPACE}/{KCP}")
        })
    }

    /// `kubectl scale kcp --replicas N` as `user`: an update of the `scale` subresource.
    pub async fn scale_kcp(&self, replicas: i32, user: &str) -> Answer {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client_as(user)?, NAMESPACE, &kcp_resource());
        let patch = Patch::Merge(json!({ "spec": { "replicas": replicas } }));
        let result = api.patch_scale(KCP, &PatchParams::default(), &patch).await;
        // The Scale answered carries the KCP's resourceVersion.
        self.api
            .seen(&kcp_resource(), result.as_ref().ok().map(|s| &s.metadata))
            .await?;
        answer(result, || {
            format!("scaling KubeadmControlPlane {NAMESPACE}/{KCP}")
        })
    }

    /// Merge-patches Machine `name`'s metadata as `user` (annotations, finalizers).
    pub async fn patch_machine_metadata(
        &self,
        name: &str,
        metadata: Value,
        user: &str,
    ) -> Result<(), WorldError> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client_as(user)?, NAMESPACE, &machine_resource());
        let written = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": metadata })),
            )
            .await;
        self.machine_written(written, || format!("updating Machine {NAMESPACE}/{name}"))
            .await
    }
}

impl World {
    /// A Machine written: the API's error, or waiting until the world's reads have seen it.
    async fn machine_written(
        &self,
        written: kube::Result<DynamicObject>,
        what: impl FnOnce() -> String,
    ) -> Result<(), WorldError> {
        let written = written.map_err(|source| WorldError::Api {
            what: what(),
            source,
        })?;
        self.api
            .seen(&machine_resource(), Some(&written.metadata))
            .await
    }
}

/// What the API server said to a request a person or controller makes: `Ok(Err((code,
/// message)))` when it refused (a webhook's denial among others), `Err` when it could not be asked.
type Answer = Result<Result<(), (u16, String)>, WorldError>;

fn answer<T>(result: Result<T, kube::Error>, what: impl FnOnce() -> String) -> Answer {
    match result {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(status)) => Ok(Err((status.code, status.message))),
        Err(source) => Err(WorldError::Api {
            what: what(),
            source,
        }),
    }
}
