//! The management cluster: its client configuration, found as kubectl finds it, and what is
//! asked of its API server (the three lists, converted as the watch does, and the etcd CA Secret).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};

use super::ProbeArgs;
use quorumguard_engine::LABEL_CONTROL_PLANE;
use quorumguard_observe::capi::{CapiCluster, CapiHealthCheck, CapiKcp, CapiMachine};
use quorumguard_observe::etcd::ETCD_TRANSPORT_ANNOTATION;
use quorumguard_observe::state::{Key, Kind, Object, watch};

/// The management cluster's client configuration, found as kubectl finds it.
pub(crate) async fn kube_config(args: &ProbeArgs) -> anyhow::Result<kube::Config> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let context = match &args.context {
        Some(c) => format!(" (context {c:?})"),
        None => String::new(),
    };
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("using kubeconfig {}{context}", path.display()))?
        }
        // A context names an entry of a kubeconfig file: no in-cluster fallback then.
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("using $KUBECONFIG or ~/.kube/config{context}"))?,
        None => kube::Config::infer().await.context(
            "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, or write ~/.kube/config",
        )?,
    };
    config.read_timeout = Some(args.request_timeout);
    config.connect_timeout = Some(args.request_timeout.min(Duration::from_secs(10)));
    Ok(config)
}

/// Where to list: one namespace, or all.
#[derive(Clone, Debug)]
pub(crate) enum Scope {
    Namespace(String),
    All,
}

/// What the three lists gave, converted.
#[derive(Default)]
pub(crate) struct Listed {
    pub(crate) clusters: Vec<CapiCluster>,
    pub(crate) kcps: Vec<CapiKcp>,
    pub(crate) machines: Vec<CapiMachine>,
    /// The MachineHealthChecks, unless listing them failed: then `health_checks_error` says
    /// why, and whether a remediation can happen is not known (never "none").
    pub(crate) health_checks: Vec<CapiHealthCheck>,
    pub(crate) health_checks_error: Option<String>,
    /// Cluster key -> its `quorumguard.io/etcd-transport` annotation, as written.
    pub(crate) transports: BTreeMap<Key, String>,
    pub(crate) warnings: Vec<String>,
}

/// Everything the API server is asked, with its URL for messages and a bound on each call.
pub(crate) struct Mgmt {
    pub(crate) client: Client,
    pub(crate) server: String,
    pub(crate) timeout: Duration,
}

impl Mgmt {
    /// Lists one kind (control-plane Machines only) in `scope`.
    pub(crate) async fn list(
        &self,
        kind: Kind,
        scope: &Scope,
    ) -> anyhow::Result<Vec<DynamicObject>> {
        let ar = watch::api_resource(kind);
        let (api, where_): (Api<DynamicObject>, String) = match scope {
            Scope::Namespace(ns) => (
                Api::namespaced_with(self.client.clone(), ns, &ar),
                format!("in namespace {ns}"),
            ),
            Scope::All => (
                Api::all_with(self.client.clone(), &ar),
                "in all namespaces".into(),
            ),
        };
        let mut lp = ListParams::default();
        if kind == Kind::Machine {
            lp = lp.labels(LABEL_CONTROL_PLANE);
        }
        let what = format!("listing {}.{}/{} {where_}", ar.plural, ar.group, ar.version);
        match tokio::time::timeout(self.timeout, api.list(&lp)).await {
            Ok(Ok(list)) => Ok(list.items),
            Ok(Err(e)) => Err(self.api_error(e, &what)),
            Err(_) => bail!(
                "{what}: the API server at {} did not answer within {:?} (--request-timeout)",
                self.server,
                self.timeout
            ),
        }
    }

    /// An API failure in words that say what to do.
    fn api_error(&self, e: kube::Error, what: &str) -> anyhow::Error {
        match &e {
            kube::Error::Api(s) if s.code == 404 => anyhow!(
                "{what}: the API server at {} does not serve it (404 {}): is this the management \
                 cluster, with Cluster API's v1beta2 CRDs installed?",
                self.server,
                s.reason
            ),
            kube::Error::Api(s) if s.code == 401 || s.code == 403 => anyhow!(
                "{what}: {} ({} {}): quorumguard status and preflight need get and list on clusters, \
                 kubeadmcontrolplanes, machines and machinehealthchecks (without the last, whether a \
                 remediation can happen is not known), and get on Secrets <cluster>-etcd (and \
                 <cluster>-kubeconfig for the port-forward transport)",
                s.message,
                s.code,
                s.reason
            ),
            _ => anyhow::Error::new(e).context(format!(
                "{what}: cannot use the API server at {}",
                self.server
            )),
        }
    }

    /// Lists the three kinds and converts them as the watch does; then the
    /// MachineHealthChecks, whose list may fail without failing the rest (the next action then
    /// says their coverage is not known).
    pub(crate) async fn list_all(&self, scope: &Scope) -> anyhow::Result<Listed> {
        let (clusters, kcps, machines) = futures::try_join!(
            self.list(Kind::Cluster, scope),
            self.list(Kind::Kcp, scope),
            self.list(Kind::Machine, scope),
        )?;
        let mut out = Listed::default();
        let checks = match self.list(Kind::HealthCheck, scope).await {
            Ok(c) => c,
            Err(e) => {
                out.health_checks_error = Some(format!("{e:#}"));
                Vec::new()
            }
        };
        for (kind, objects) in [
            (Kind::Cluster, clusters),
            (Kind::Kcp, kcps),
            (Kind::Machine, machines),
            (Kind::HealthCheck, checks),
        ] {
            for o in objects {
                if kind == Kind::Cluster
                    && let Some(t) = o.annotations().get(ETCD_TRANSPORT_ANNOTATION)
                {
                    out.transports
                        .insert((o.namespace().unwrap_or_default(), o.name_any()), t.clone());
                }
                match watch::convert(kind, &o) {
                    Ok(Object::Cluster(c)) => out.clusters.push(c),
                    Ok(Object::Kcp(k)) => out.kcps.push(k),
                    Ok(Object::Machine(m)) => out.machines.push(m),
                    Ok(Object::HealthCheck(h)) => out.health_checks.push(h),
                    Err(e) => out.warnings.push(format!(
                        "ignoring {} {}/{}, which quorumguard cannot read: {e}",
                        kind.as_str(),
                        o.namespace().unwrap_or_default(),
                        o.name_any()
                    )),
                }
            }
        }
        Ok(out)
    }

    /// Says what is wrong when a probe failed because of the `<cluster>-etcd` Secret: missing or
    /// unreadable. `None` when the Secret is readable (the probe's own error then stands).
    pub(crate) async fn explain_secret(&self, namespace: &str, cluster: &str) -> Option<String> {
        let name = format!("{cluster}-etcd");
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(self.timeout, secrets.get_opt(&name)).await {
            Ok(Ok(None)) => Some(format!(
                "Secret {namespace}/{name} not found: the etcd prober needs the cluster's etcd CA \
                 from it (keys tls.crt and tls.key) to sign its client certificate, as KCP does. \
                 Cluster API creates it with the cluster: check that Cluster {namespace}/{cluster} \
                 is managed from this management cluster"
            )),
            Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => Some(format!(
                "cannot read Secret {namespace}/{name} ({} {}): the etcd prober needs get on it \
                 for the cluster's etcd CA",
                s.code, s.reason
            )),
            _ => None,
        }
    }
}
