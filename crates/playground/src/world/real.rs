//! The world on a real kube-apiserver: starting it, and registering the repo's
//! ValidatingWebhookConfiguration there with kube-apiserver calling the webhooks through the
//! recording relay ([`crate::webhooks::Relay`]) in front of `quorumguard serve`.

use std::path::Path;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::Value;

use super::backend::{Backend, RealBackend};
use super::{HUMAN, NAMESPACE, RealApiPlan, WorldError};
use crate::apiserver::machine_resource;
use crate::realapi::{RealApi, webhook_at};
use crate::webhooks::{MANIFEST, Relay, WebhookDispatcher};

/// How long kube-apiserver may take to start calling a new webhook configuration.
const WEBHOOK_WAIT: Duration = Duration::from_secs(20);

/// Starts the real API server (its files in `dir/kube-apiserver`) and mirrors its objects.
pub(super) async fn start_real(plan: &RealApiPlan, dir: &Path) -> Result<Backend, WorldError> {
    let api = RealApi::start(&plan.assets, &plan.crds, &dir.join("kube-apiserver"))
        .await
        .map_err(|e| WorldError::Other(format!("the real kube-apiserver: {e}")))?;
    Ok(Backend::Real(Box::new(RealBackend::start(api).await?)))
}

/// Serves the relay for `webhooks`, registers the ValidatingWebhookConfiguration of
/// `manifests/` pointed at it, and waits (bounded) until kube-apiserver calls it.
pub(super) async fn real_webhooks(
    real: &RealBackend,
    webhooks: &Arc<WebhookDispatcher>,
) -> Result<(), WorldError> {
    let other = |what: &str, e: String| WorldError::Other(format!("{what}: {e}"));
    let (cert, key) = real
        .with_api(|r| r.loopback_server_cert("quorumguard-playground-relay", &[]))
        .map_err(|e| other("the relay's certificate", e.to_string()))?;
    let ca_pem = real.with_api(|r| r.ca_pem().to_string());
    let relay = Relay::start(Arc::clone(webhooks), &cert, &key)
        .map_err(|e| other("the webhook relay", e))?;
    let addr = relay.addr;
    *real.relay.lock().unwrap_or_else(PoisonError::into_inner) = Some(relay);

    let vwc: Value =
        serde_yaml::from_str(MANIFEST).map_err(|e| WorldError::Webhooks(e.to_string()))?;
    let vwc: ValidatingWebhookConfiguration =
        serde_json::from_value(webhook_at(&vwc, addr, &ca_pem))
            .map_err(|e| WorldError::Webhooks(e.to_string()))?;
    let client = real.admin_client()?;
    Api::<ValidatingWebhookConfiguration>::all(client)
        .create(&PostParams::default(), &vwc)
        .await
        .map_err(|source| WorldError::Api {
            what: "creating the ValidatingWebhookConfiguration".into(),
            source,
        })?;
    wait_called(real, webhooks).await
}

/// Asks kube-apiserver to delete a Machine as a person, dry run (nothing changes), until the
/// webhook is called: kube-apiserver picks a new configuration up within a second or so.
async fn wait_called(real: &RealBackend, webhooks: &WebhookDispatcher) -> Result<(), WorldError> {
    let before = webhooks.call_count();
    let client = kube::Client::try_from(real.config_as(HUMAN)).map_err(WorldError::Client)?;
    let machines: Api<DynamicObject> = Api::namespaced_with(client, NAMESPACE, &machine_resource());
    let name = machines
        .list(&Default::default())
        .await
        .ok()
        .and_then(|l| l.items.into_iter().next())
        .and_then(|m| m.metadata.name)
        .ok_or_else(|| WorldError::Other("no Machine to probe the webhook with".into()))?;
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let deadline = tokio::time::Instant::now() + WEBHOOK_WAIT;
    while webhooks.call_count() == before {
        if tokio::time::Instant::now() >= deadline {
            return Err(WorldError::Webhooks(format!(
                "kube-apiserver did not call the webhook within {WEBHOOK_WAIT:?} of registering it"
            )));
        }
        let _ = machines.delete(&name, &dry_run).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
