//! `--patch-webhook`: finding the ValidatingWebhookConfiguration before any file is written,
//! and setting every webhook's caBundle with one JSON patch, bounded in time.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use super::CertsArgs;

/// The annotation that makes cert-manager's cainjector own a webhook configuration's caBundle.
const INJECT_CA_ANNOTATION: &str = "cert-manager.io/inject-ca-from";

/// How long talking to the API server may take, in all, for `--patch-webhook`.
const PATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// The ValidatingWebhookConfiguration to patch, found (and its webhooks listed) before any
/// file is written, so a wrong name or an unreachable API server leaves nothing behind.
pub(super) struct WebhookTarget {
    runtime: tokio::runtime::Runtime,
    api: Api<ValidatingWebhookConfiguration>,
    pub(super) name: String,
    pub(super) webhooks: Vec<String>,
}

impl WebhookTarget {
    pub(super) fn find(args: &CertsArgs, name: &str) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let (api, webhooks) = runtime.block_on(bounded(name, find_webhooks(args, name)))?;
        Ok(Self {
            runtime,
            api,
            name: name.to_string(),
            webhooks,
        })
    }

    /// Sets `caBundle` of every webhook with one JSON patch, which fails if the webhooks
    /// changed since [`WebhookTarget::find`] read them.
    pub(super) fn patch(&self, ca_bundle: &str) -> anyhow::Result<()> {
        let name = &self.name;
        let patch = serde_json::from_value(ca_bundle_patch(&self.webhooks, ca_bundle))
            .context("cannot build the JSON patch")?;
        self.runtime.block_on(bounded(name, async {
            self.api
                .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
                .with_context(|| format!("cannot patch ValidatingWebhookConfiguration {name}"))?;
            Ok(())
        }))
    }
}

/// Bounds a conversation with the API server by [`PATCH_TIMEOUT`].
async fn bounded<T>(
    name: &str,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(PATCH_TIMEOUT, work)
        .await
        .map_err(|_| {
            anyhow!(
                "--patch-webhook {name}: no answer from the API server within {}s",
                PATCH_TIMEOUT.as_secs()
            )
        })?
}

async fn find_webhooks(
    args: &CertsArgs,
    name: &str,
) -> anyhow::Result<(Api<ValidatingWebhookConfiguration>, Vec<String>)> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            std::fs::File::open(path)
                .with_context(|| format!("{}: cannot read", path.display()))?;
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("{}: not a kubeconfig", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("{}: unusable kubeconfig", path.display()))?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("cannot load the kubeconfig")?,
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found (use --kubeconfig)")?,
    };
    let client = kube::Client::try_from(config).context("cannot make a Kubernetes client")?;
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let vwc = api
        .get_opt(name)
        .await
        .with_context(|| format!("cannot read ValidatingWebhookConfiguration {name}"))?
        .ok_or_else(|| {
            anyhow!(
                "ValidatingWebhookConfiguration {name} not found: apply the manifests first \
                 (kubectl apply -k manifests/no-cert-manager/); nothing was written"
            )
        })?;
    if let Some(owner) = vwc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INJECT_CA_ANNOTATION))
    {
        eprintln!(
            "quorumguard: warning: ValidatingWebhookConfiguration {name} has \
             {INJECT_CA_ANNOTATION}: {owner}: cert-manager's cainjector will overwrite this \
             caBundle. Without cert-manager, install manifests/no-cert-manager/ instead."
        );
    }
    let webhooks: Vec<String> = vwc
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.name)
        .collect();
    if webhooks.is_empty() {
        bail!("ValidatingWebhookConfiguration {name} has no webhooks to patch");
    }
    Ok((api, webhooks))
}

/// A JSON patch (RFC 6902) setting `clientConfig.caBundle` of every webhook, in the order the
/// configuration lists them. Each webhook's name is tested first, so the patch fails rather
/// than touch the wrong entry if the list changed since it was read.
pub(super) fn ca_bundle_patch(webhook_names: &[String], ca_bundle: &str) -> Value {
    let mut ops = Vec::with_capacity(webhook_names.len() * 2);
    for (i, name) in webhook_names.iter().enumerate() {
        ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": name}));
        ops.push(json!({
            "op": "add",
            "path": format!("/webhooks/{i}/clientConfig/caBundle"),
            "value": ca_bundle,
        }));
    }
    Value::Array(ops)
}
