//! The kustomize base in `manifests/`, as `kubectl kustomize manifests/` renders it: the
//! ValidatingWebhookConfiguration registers exactly what the webhook judges and never its own
//! namespace, the Deployment is hardened and probed on the admin port, RBAC is least privilege,
//! and the pieces agree with each other (ports, names, labels, the certificate Secret).
//!
//! Every Kubernetes object also goes through k8s-openapi's types and back: a misspelt or
//! misplaced field vanishes on the way and fails the test.
//!
//! Without `kubectl` (neither /usr/bin/kubectl nor one on PATH), the raw YAML files are read
//! instead, with the little of kustomize these manifests use applied by hand (resources,
//! components, the annotation patch, images); a message says so. Setting
//! `QUORUMGUARD_TEST_MANIFESTS_RAW=1` forces that path.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhook, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::Value;
use testkit::manifests::{kubectl, manifests_dir, render};

const NS: &str = "quorumguard-system";

/// The rendered objects, found by kind and name.
struct Objects(Vec<Value>);

impl Objects {
    fn load(dir: &Path) -> Self {
        Self(render(dir))
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.0
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    fn raw(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name)
            .unwrap_or_else(|| panic!("{kind}/{name} is not in the rendered manifests"))
    }

    /// The object as its k8s-openapi type, after checking that nothing is lost on the way.
    fn typed<T: DeserializeOwned + serde::Serialize>(&self, kind: &str, name: &str) -> T {
        roundtrip(self.raw(kind, name))
    }
}

/// Deserializes into the typed object and serializes it back: equal only if every field in the
/// YAML is a real field of the Kubernetes API, at the right place and of the right type.
fn roundtrip<T: DeserializeOwned + serde::Serialize>(raw: &Value) -> T {
    let what = format!("{}/{}", raw["kind"], raw["metadata"]["name"]);
    let typed: T = serde_json::from_value(raw.clone())
        .unwrap_or_else(|e| panic!("{what} does not fit the Kubernetes API: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    if let Some(diff) = first_difference(raw, &back, String::new()) {
        panic!("{what}: {diff} (a misspelt or misplaced field?)");
    }
    typed
}

fn first_difference(want: &Value, got: &Value, at: String) -> Option<String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                let here = format!("{at}.{k}");
                match g.get(k) {
                    None => return Some(format!("{here} is not an API field")),
                    Some(gv) => {
                        if let Some(d) = first_difference(wv, gv, here) {
                            return Some(d);
                        }
                    }
                }
            }
            g.keys()
                .find(|k| !w.contains_key(*k))
                .map(|k| format!("{at}.{k} appeared"))
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => w
            .iter()
            .zip(g)
            .enumerate()
            .find_map(|(i, (wv, gv))| first_difference(wv, gv, format!("{at}[{i}]"))),
        _ if want == got => None,
        _ => Some(format!("{at}: {want} became {got}")),
    }
}

fn default_render() -> Objects {
    Objects::load(&manifests_dir())
}

fn labels_match(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    assert!(
        selector.match_expressions.is_none(),
        "only matchLabels selectors are used here"
    );
    let want = selector.match_labels.clone().unwrap_or_default();
    !want.is_empty() && want.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_spec(d: &Deployment) -> &PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
}

fn pod_labels(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("pod labels")
}

fn container(d: &Deployment) -> &Container {
    let containers = &pod_spec(d).containers;
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The container port a Service or probe port refers to (by number or by name).
fn container_port(c: &Container, port: &IntOrString) -> i32 {
    let ports = c.ports.as_deref().unwrap_or_default();
    match port {
        IntOrString::Int(n) => {
            assert!(
                ports.iter().any(|p| p.container_port == *n),
                "port {n} declared"
            );
            *n
        }
        IntOrString::String(name) => {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    }
}

fn strings(v: &Option<Vec<String>>) -> Vec<&str> {
    v.as_deref()
        .unwrap_or_default()
        .iter()
        .map(String::as_str)
        .collect()
}

fn webhook<'a>(vwc: &'a ValidatingWebhookConfiguration, name: &str) -> &'a ValidatingWebhook {
    vwc.webhooks
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("webhook {name}"))
}

#[test]
fn the_base_renders_exactly_the_expected_objects_in_the_right_namespace() {
    let objects = default_render();
    let got: BTreeSet<(String, String)> = objects
        .0
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_string(),
                o["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(got.len(), objects.0.len(), "no duplicates");
    let want: BTreeSet<(String, String)> = [
        ("Namespace", NS),
        ("ServiceAccount", "quorumguard"),
        ("ClusterRole", "quorumguard"),
        ("ClusterRoleBinding", "quorumguard"),
        ("Role", "quorumguard-leader-election"),
        ("RoleBinding", "quorumguard-leader-election"),
        ("Deployment", "quorumguard"),
        ("PodDisruptionBudget", "quorumguard"),
        ("Service", "quorumguard-webhook"),
        ("Service", "quorumguard-metrics"),
        ("NetworkPolicy", "quorumguard"),
        ("Issuer", "quorumguard-selfsigned"),
        ("Certificate", "quorumguard-webhook"),
        ("ValidatingWebhookConfiguration", "quorumguard"),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), n.to_string()))
    .collect();
    assert_eq!(got, want);

    let cluster_scoped = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
    ];
    for o in &objects.0 {
        let kind = o["kind"].as_str().unwrap();
        let ns = &o["metadata"]["namespace"];
        if cluster_scoped.contains(&kind) {
            assert!(ns.is_null(), "{kind} is cluster-scoped: {ns}");
        } else {
            assert_eq!(ns, NS, "{kind}/{}", o["metadata"]["name"]);
        }
        assert_eq!(
            o["metadata"]["labels"]["app.kubernetes.io/name"], "quorumguard",
            "{kind}"
        );
    }

    // Every Kubernetes object survives its typed form (no unknown or misplaced fields).
    let _: Namespace = objects.typed("Namespace", NS);
    let _: ServiceAccount = objects.typed("ServiceAccount", "quorumguard");
    let _: ClusterRole = objects.typed("ClusterRole", "quorumguard");
    let _: ClusterRoleBinding = objects.typed("ClusterRoleBinding", "quorumguard");
    let _: Role = objects.typed("Role", "quorumguard-leader-election");
    let _: RoleBinding = objects.typed("RoleBinding", "quorumguard-leader-election");
    let _: Deployment = objects.typed("Deployment", "quorumguard");
    let _: PodDisruptionBudget = objects.typed("PodDisruptionBudget", "quorumguard");
    let _: Service = objects.typed("Service", "quorumguard-webhook");
    let _: Service = objects.typed("Service", "quorumguard-metrics");
    let _: NetworkPolicy = objects.typed("NetworkPolicy", "quorumguard");
    let _: ValidatingWebhookConfiguration =
        objects.typed("ValidatingWebhookConfiguration", "quorumguard");
}

#[test]
fn the_webhook_configuration_registers_exactly_what_the_guard_judges() {
    let objects = default_render();
    let vwc: ValidatingWebhookConfiguration =
        objects.typed("ValidatingWebhookConfiguration", "quorumguard");
    let names: Vec<&str> = vwc
        .webhooks
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|w| w.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "machines.quorumguard.io",
            "kubeadmcontrolplanes.quorumguard.io"
        ]
    );

    let webhook_service: Service = objects.typed("Service", "quorumguard-webhook");
    for w in vwc.webhooks.as_deref().unwrap_or_default() {
        let n = &w.name;
        assert_eq!(w.admission_review_versions, ["v1"], "{n}");
        assert_eq!(w.side_effects, "NoneOnDryRun", "{n}");
        assert_eq!(w.match_policy.as_deref(), Some("Equivalent"), "{n}");
        assert_eq!(w.failure_policy.as_deref(), Some("Fail"), "{n}");
        let timeout = w.timeout_seconds.expect("timeoutSeconds set");
        assert!((1..=10).contains(&timeout), "{n}: timeoutSeconds {timeout}");
        assert_eq!(timeout, 5, "{n}");
        assert!(
            w.client_config.url.is_none(),
            "{n}: through the Service, not a URL"
        );
        let svc = w
            .client_config
            .service
            .as_ref()
            .expect("clientConfig.service");
        assert_eq!(svc.name, "quorumguard-webhook", "{n}");
        assert_eq!(svc.namespace, NS, "{n}");
        assert_eq!(svc.port, Some(443), "{n}");
        // The Service really has that port.
        let ports = webhook_service
            .spec
            .as_ref()
            .unwrap()
            .ports
            .as_deref()
            .unwrap();
        assert!(ports.iter().any(|p| Some(p.port) == svc.port), "{n}");

        // Never the guard's own namespace: a broken guard must not block its own repair.
        let ns_selector = w.namespace_selector.as_ref().expect("namespaceSelector");
        assert!(ns_selector.match_labels.is_none(), "{n}");
        let exprs = ns_selector.match_expressions.as_deref().unwrap_or_default();
        assert_eq!(exprs.len(), 1, "{n}");
        assert_eq!(exprs[0].key, "kubernetes.io/metadata.name", "{n}");
        assert_eq!(exprs[0].operator, "NotIn", "{n}");
        assert_eq!(strings(&exprs[0].values), [NS], "{n}");

        let rules = w.rules.as_deref().unwrap_or_default();
        assert_eq!(rules.len(), 1, "{n}");
        assert_eq!(rules[0].scope.as_deref(), Some("Namespaced"), "{n}");
        assert_eq!(strings(&rules[0].api_versions), ["*"], "{n}");
        // The match conditions only narrow what reaches the guard to what it judges (so a dead
        // guard blocks no teardown and no metadata-only update): the Machine webhook skips the
        // teardown identities, KCP's own teardown (its service account deleting a Machine
        // without KCP's pre-terminate hook) and clusterctl move's deletions of Machines without
        // finalizers, the KCP webhook metadata-only updates.
        let conditions = w.match_conditions.as_deref().unwrap_or_default();
        let expected: Vec<(&str, Vec<&str>)> = if n == "machines.quorumguard.io" {
            vec![
                (
                    "not-teardown",
                    vec![
                        "generic-garbage-collector",
                        "system:kube-controller-manager",
                        "namespace-controller",
                    ],
                ),
                (
                    "not-kcp-teardown",
                    vec![
                        quorumguard::engine::DEFAULT_KCP_CONTROLLER,
                        "oldObject.metadata.annotations",
                        "pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup",
                    ],
                ),
                (
                    "not-clusterctl-move",
                    vec![
                        quorumguard::engine::ANNOTATION_DELETE_FOR_MOVE,
                        "oldObject.metadata.annotations",
                        "size(oldObject.metadata.finalizers) == 0",
                    ],
                ),
            ]
        } else {
            vec![("spec-changed", vec!["object.spec != oldObject.spec"])]
        };
        assert_eq!(conditions.len(), expected.len(), "{n}");
        for (condition, (name, needles)) in conditions.iter().zip(expected) {
            assert_eq!(condition.name, name, "{n}");
            for needle in needles {
                assert!(condition.expression.contains(needle), "{n}: {needle}");
            }
        }
    }

    let machines = webhook(&vwc, "machines.quorumguard.io");
    let rule = &machines.rules.as_deref().unwrap()[0];
    assert_eq!(strings(&rule.api_groups), ["cluster.x-k8s.io"]);
    assert_eq!(strings(&rule.operations), ["DELETE"]);
    assert_eq!(strings(&rule.resources), ["machines"]);
    let path = machines
        .client_config
        .service
        .as_ref()
        .unwrap()
        .path
        .as_deref();
    assert_eq!(path, Some("/validate/machines"));
    // Only control-plane Machines reach the webhook.
    let selector = machines.object_selector.as_ref().expect("objectSelector");
    assert!(selector.match_labels.is_none());
    let exprs = selector.match_expressions.as_deref().unwrap();
    assert_eq!(exprs.len(), 1);
    assert_eq!(exprs[0].key, "cluster.x-k8s.io/control-plane");
    assert_eq!(exprs[0].operator, "Exists");
    assert!(exprs[0].values.is_none());

    let kcp = webhook(&vwc, "kubeadmcontrolplanes.quorumguard.io");
    let rule = &kcp.rules.as_deref().unwrap()[0];
    assert_eq!(strings(&rule.api_groups), ["controlplane.cluster.x-k8s.io"]);
    assert_eq!(strings(&rule.operations), ["UPDATE"]);
    assert_eq!(
        strings(&rule.resources),
        ["kubeadmcontrolplanes", "kubeadmcontrolplanes/scale"],
        "spec.replicas changes directly and through the scale subresource"
    );
    let path = kcp.client_config.service.as_ref().unwrap().path.as_deref();
    assert_eq!(path, Some("/validate/kubeadmcontrolplanes"));
    assert!(kcp.object_selector.is_none());

    // Nothing else: no pods, nodes, or other resources, and never CREATE/CONNECT.
    let all_resources: BTreeSet<&str> = vwc
        .webhooks
        .as_deref()
        .unwrap()
        .iter()
        .flat_map(|w| w.rules.as_deref().unwrap())
        .flat_map(|r| strings(&r.resources))
        .collect();
    assert_eq!(
        all_resources,
        BTreeSet::from([
            "machines",
            "kubeadmcontrolplanes",
            "kubeadmcontrolplanes/scale"
        ])
    );
}

#[test]
fn cert_manager_issues_the_secret_the_deployment_mounts_and_injects_its_ca() {
    let objects = default_render();
    let issuer = objects.raw("Issuer", "quorumguard-selfsigned");
    assert_eq!(issuer["apiVersion"], "cert-manager.io/v1");
    assert!(issuer["spec"]["selfSigned"].is_object(), "{issuer}");

    let cert = objects.raw("Certificate", "quorumguard-webhook");
    assert_eq!(cert["apiVersion"], "cert-manager.io/v1");
    assert_eq!(
        cert["spec"]["dnsNames"],
        serde_json::json!([
            "quorumguard-webhook.quorumguard-system.svc",
            "quorumguard-webhook.quorumguard-system.svc.cluster.local"
        ])
    );
    assert_eq!(cert["spec"]["secretName"], "quorumguard-webhook-tls");
    assert_eq!(cert["spec"]["issuerRef"]["kind"], "Issuer");
    assert_eq!(cert["spec"]["issuerRef"]["name"], "quorumguard-selfsigned");

    let vwc = objects.raw("ValidatingWebhookConfiguration", "quorumguard");
    assert_eq!(
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "quorumguard-system/quorumguard-webhook",
        "cainjector fills the caBundle from the Certificate"
    );

    let deployment: Deployment = objects.typed("Deployment", "quorumguard");
    let secret_volumes: Vec<&str> = pod_spec(&deployment)
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.secret.as_ref()?.secret_name.as_deref())
        .collect();
    assert_eq!(secret_volumes, ["quorumguard-webhook-tls"]);
}

#[test]
fn without_cert_manager_the_same_install_renders_minus_its_three_pieces() {
    let base = default_render();
    let plain = Objects::load(&manifests_dir().join("no-cert-manager"));
    assert!(plain.find("Issuer", "quorumguard-selfsigned").is_none());
    assert!(plain.find("Certificate", "quorumguard-webhook").is_none());
    let vwc = plain.raw("ValidatingWebhookConfiguration", "quorumguard");
    assert!(
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_null(),
        "nothing would inject a CA: `quorumguard certs --patch-webhook` does"
    );
    let _: ValidatingWebhookConfiguration = roundtrip(vwc);
    // Everything else is identical to the default install.
    let mut base_vwc = base
        .raw("ValidatingWebhookConfiguration", "quorumguard")
        .clone();
    let annotations = base_vwc["metadata"].as_object_mut().unwrap();
    annotations.remove("annotations");
    assert_eq!(&base_vwc, vwc);
    for o in &plain.0 {
        let (kind, name) = (
            o["kind"].as_str().unwrap(),
            o["metadata"]["name"].as_str().unwrap(),
        );
        if kind != "ValidatingWebhookConfiguration" {
            assert_eq!(base.find(kind, name), Some(o), "{kind}/{name}");
        }
    }
    assert_eq!(plain.0.len(), base.0.len() - 2);
}

#[test]
fn the_deployment_is_hardened_replicated_and_probed_on_the_admin_port() {
    let objects = default_render();
    let d: Deployment = objects.typed("Deployment", "quorumguard");
    let spec = d.spec.as_ref().unwrap();
    assert!(spec.replicas.unwrap_or(1) >= 2, "at least two replicas");
    assert!(labels_match(&spec.selector, &pod_labels(&d)));
    let rolling = spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref());
    assert_eq!(
        rolling.and_then(|r| r.max_unavailable.clone()),
        Some(IntOrString::Int(0)),
        "a rollout never drops below the replica count"
    );

    let pod = pod_spec(&d);
    assert_eq!(pod.service_account_name.as_deref(), Some("quorumguard"));
    assert!(objects.find("ServiceAccount", "quorumguard").is_some());
    assert_eq!(pod.automount_service_account_token, Some(true));
    assert_eq!(pod.termination_grace_period_seconds, Some(30));
    assert!(
        pod.priority_class_name.is_none(),
        "system-cluster-critical is not allowed everywhere"
    );
    assert!(pod.host_network.is_none() && pod.host_pid.is_none());

    let psc = pod.security_context.as_ref().expect("pod securityContext");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.run_as_user, Some(65532));
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );

    // Spread over nodes, but still schedulable on one.
    let anti = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .expect("podAntiAffinity");
    assert!(
        anti.required_during_scheduling_ignored_during_execution
            .is_none()
    );
    let preferred = anti
        .preferred_during_scheduling_ignored_during_execution
        .as_deref()
        .unwrap_or_default();
    assert_eq!(preferred.len(), 1);
    assert_eq!(
        preferred[0].pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    let selector = preferred[0]
        .pod_affinity_term
        .label_selector
        .as_ref()
        .unwrap();
    assert!(labels_match(selector, &pod_labels(&d)));

    let c = container(&d);
    if kubectl().is_some() {
        assert_eq!(
            c.image.as_deref(),
            Some("ghcr.io/quorumguard/quorumguard:0.1.0")
        );
    }
    let csc = c
        .security_context
        .as_ref()
        .expect("container securityContext");
    assert_eq!(csc.run_as_non_root, Some(true));
    assert_eq!(csc.run_as_user, Some(65532));
    assert_eq!(csc.read_only_root_filesystem, Some(true));
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert!(csc.privileged.is_none() || csc.privileged == Some(false));
    let caps = csc.capabilities.as_ref().expect("capabilities");
    assert_eq!(strings(&caps.drop), ["ALL"]);
    assert!(caps.add.is_none());
    assert_eq!(
        csc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );

    assert_eq!(
        strings(&c.args),
        [
            "serve",
            "--listen=0.0.0.0:8443",
            "--admin-listen=0.0.0.0:8080",
            "--tls-cert-file=/tls/tls.crt",
            "--tls-key-file=/tls/tls.key",
            "--log-format=json",
        ]
    );
    let env: BTreeMap<&str, &str> = c
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let field = e
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str())
                .unwrap_or("");
            (e.name.as_str(), field)
        })
        .collect();
    assert_eq!(env.get("POD_NAME"), Some(&"metadata.name"));
    assert_eq!(env.get("POD_NAMESPACE"), Some(&"metadata.namespace"));

    let ports: BTreeMap<&str, i32> = c
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|p| (p.name.as_deref().unwrap_or(""), p.container_port))
        .collect();
    assert_eq!(ports, BTreeMap::from([("webhook", 8443), ("admin", 8080)]));

    // The serving certificate: mounted read-only where the args point.
    let mounts = c.volume_mounts.as_deref().unwrap_or_default();
    let tls = mounts
        .iter()
        .find(|m| m.mount_path == "/tls")
        .expect("/tls mount");
    assert_eq!(tls.read_only, Some(true));
    let volume = pod
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|v| v.name == tls.name)
        .expect("the mounted volume");
    let secret = volume.secret.as_ref().expect("a Secret volume");
    assert_eq!(
        secret.secret_name.as_deref(),
        Some("quorumguard-webhook-tls")
    );

    // Probes: plain HTTP on the admin port.
    for (which, probe, path) in [
        ("readiness", &c.readiness_probe, "/readyz"),
        ("liveness", &c.liveness_probe, "/livez"),
        ("startup", &c.startup_probe, "/livez"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("{which}Probe httpGet"));
        assert_eq!(get.path.as_deref(), Some(path), "{which}");
        assert_eq!(
            container_port(c, &get.port),
            8080,
            "{which} on the admin port"
        );
        assert!(
            get.scheme.is_none() || get.scheme.as_deref() == Some("HTTP"),
            "{which}"
        );
    }

    let resources = c.resources.as_ref().expect("resources");
    for key in ["cpu", "memory"] {
        assert!(
            resources
                .requests
                .as_ref()
                .is_some_and(|r| r.contains_key(key)),
            "request {key}"
        );
        assert!(
            resources
                .limits
                .as_ref()
                .is_some_and(|r| r.contains_key(key)),
            "limit {key}"
        );
    }
}

#[test]
fn services_pdb_and_network_policy_select_the_guard_and_agree_on_ports() {
    let objects = default_render();
    let d: Deployment = objects.typed("Deployment", "quorumguard");
    let labels = pod_labels(&d);
    let c = container(&d);

    for (name, port, target) in [
        ("quorumguard-webhook", 443, 8443),
        ("quorumguard-metrics", 8080, 8080),
    ] {
        let svc: Service = objects.typed("Service", name);
        let spec = svc.spec.as_ref().unwrap();
        let selector = spec.selector.clone().unwrap_or_default();
        assert!(
            !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "{name}"
        );
        assert!(
            matches!(spec.type_.as_deref(), None | Some("ClusterIP")),
            "{name}"
        );
        let ports = spec.ports.as_deref().unwrap_or_default();
        assert_eq!(ports.len(), 1, "{name}");
        assert_eq!(ports[0].port, port, "{name}");
        let target_port = ports[0].target_port.as_ref().expect("targetPort");
        assert_eq!(container_port(c, target_port), target, "{name}");
    }

    let pdb: PodDisruptionBudget = objects.typed("PodDisruptionBudget", "quorumguard");
    let spec = pdb.spec.as_ref().unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
    assert!(spec.max_unavailable.is_none());
    assert!(labels_match(spec.selector.as_ref().unwrap(), &labels));
    assert!(
        spec.min_available
            .as_ref()
            .is_some_and(|m| *m == IntOrString::Int(1))
            && d.spec.as_ref().unwrap().replicas.unwrap_or(1) > 1,
        "the PDB leaves room for one disruption"
    );

    let np: NetworkPolicy = objects.typed("NetworkPolicy", "quorumguard");
    let spec = np.spec.as_ref().unwrap();
    assert!(labels_match(
        spec.pod_selector.as_ref().expect("podSelector"),
        &labels
    ));
    assert_eq!(strings(&spec.policy_types), ["Ingress", "Egress"]);
    let ingress = spec.ingress.as_deref().unwrap_or_default();
    let mut open_ports = BTreeSet::new();
    for rule in ingress {
        assert!(
            rule.from.is_none(),
            "the API server's address is not predictable"
        );
        for p in rule.ports.as_deref().unwrap_or_default() {
            open_ports.insert(container_port(c, p.port.as_ref().expect("port")));
        }
    }
    assert_eq!(open_ports, BTreeSet::from([8080, 8443]));
    let egress = spec.egress.as_deref().unwrap_or_default();
    assert!(
        egress.iter().any(|r| r.to.is_none() && r.ports.is_none()),
        "egress open: management and workload API servers"
    );
}

/// Verbs that change something.
const WRITE_VERBS: [&str; 8] = [
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
];

fn rule_has(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        strings(&r.api_groups).contains(&group)
            && strings(&r.resources).contains(&resource)
            && r.verbs.iter().any(|v| v == verb)
    })
}

#[test]
fn rbac_is_least_privilege() {
    let objects = default_render();
    let cluster_role: ClusterRole = objects.typed("ClusterRole", "quorumguard");
    let role: Role = objects.typed("Role", "quorumguard-leader-election");
    assert_eq!(role.metadata.namespace.as_deref(), Some(NS));
    let cluster_rules = cluster_role.rules.clone().unwrap_or_default();
    let role_rules = role.rules.clone().unwrap_or_default();
    assert!(cluster_role.aggregation_rule.is_none());

    // No wildcards and no nonResourceURLs or resourceNames tricks.
    for r in cluster_rules.iter().chain(&role_rules) {
        let all = strings(&r.api_groups)
            .into_iter()
            .chain(strings(&r.resources))
            .chain(r.verbs.iter().map(String::as_str));
        for s in all {
            assert!(!s.contains('*'), "wildcard in {r:?}");
        }
        assert!(r.non_resource_urls.is_none(), "{r:?}");
        assert!(
            !r.verbs.is_empty() && !strings(&r.resources).is_empty(),
            "{r:?}"
        );
    }

    // Writes only on KCP status, Events (cluster-wide) and Leases (own namespace only).
    let cluster_writes_allowed = [
        (
            "controlplane.cluster.x-k8s.io",
            "kubeadmcontrolplanes/status",
        ),
        ("events.k8s.io", "events"),
        ("", "events"),
    ];
    for r in &cluster_rules {
        if r.verbs.iter().any(|v| WRITE_VERBS.contains(&v.as_str())) {
            for g in strings(&r.api_groups) {
                for res in strings(&r.resources) {
                    assert!(
                        cluster_writes_allowed.contains(&(g, res)),
                        "ClusterRole may not write {g}/{res}: {r:?}"
                    );
                }
            }
        }
    }
    for r in &role_rules {
        assert_eq!(strings(&r.api_groups), ["coordination.k8s.io"], "{r:?}");
        assert_eq!(strings(&r.resources), ["leases"], "{r:?}");
    }

    // Exactly the verbs needed.
    let verbs = |rules: &[PolicyRule], group: &str, resource: &str| -> BTreeSet<String> {
        rules
            .iter()
            .filter(|r| {
                strings(&r.api_groups).contains(&group) && strings(&r.resources).contains(&resource)
            })
            .flat_map(|r| r.verbs.clone())
            .collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        verbs(&cluster_rules, "cluster.x-k8s.io", "clusters"),
        set(&["get", "list", "watch"])
    );
    assert_eq!(
        verbs(&cluster_rules, "cluster.x-k8s.io", "machines"),
        set(&["get", "list", "watch"])
    );
    assert_eq!(
        verbs(
            &cluster_rules,
            "controlplane.cluster.x-k8s.io",
            "kubeadmcontrolplanes"
        ),
        set(&["get", "list", "watch"])
    );
    assert_eq!(
        verbs(
            &cluster_rules,
            "controlplane.cluster.x-k8s.io",
            "kubeadmcontrolplanes/status"
        ),
        set(&["get", "update", "patch"])
    );
    assert_eq!(
        verbs(&cluster_rules, "events.k8s.io", "events"),
        set(&["create", "patch"])
    );
    assert_eq!(
        verbs(&cluster_rules, "", "events"),
        set(&["create", "patch"])
    );
    assert_eq!(
        verbs(&cluster_rules, "", "secrets"),
        set(&["get"]),
        "secrets: get by name only, never list or watch"
    );
    assert!(!rule_has(&cluster_rules, "", "secrets", "list"));
    assert_eq!(
        verbs(&role_rules, "coordination.k8s.io", "leases"),
        set(&["get", "create", "update"])
    );
    assert!(
        verbs(&cluster_rules, "coordination.k8s.io", "leases").is_empty(),
        "leases only in the guard's own namespace"
    );
    let resources: BTreeSet<&str> = cluster_rules
        .iter()
        .flat_map(|r| strings(&r.resources))
        .collect();
    assert_eq!(
        resources,
        BTreeSet::from([
            "clusters",
            "machines",
            "machinehealthchecks",
            "kubeadmcontrolplanes",
            "kubeadmcontrolplanes/status",
            "events",
            "secrets",
        ])
    );
    // MachineHealthChecks: read only, for whether remediation can happen (issue 40).
    assert_eq!(
        verbs(&cluster_rules, "cluster.x-k8s.io", "machinehealthchecks"),
        set(&["get", "list", "watch"])
    );

    // The bindings give those roles to the guard's ServiceAccount, and nothing else.
    let crb: ClusterRoleBinding = objects.typed("ClusterRoleBinding", "quorumguard");
    let rb: RoleBinding = objects.typed("RoleBinding", "quorumguard-leader-election");
    assert_eq!(
        (crb.role_ref.kind.as_str(), crb.role_ref.name.as_str()),
        ("ClusterRole", "quorumguard")
    );
    assert_eq!(
        (rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()),
        ("Role", "quorumguard-leader-election")
    );
    assert_eq!(rb.metadata.namespace.as_deref(), Some(NS));
    for subjects in [&crb.subjects, &rb.subjects] {
        let subjects = subjects.as_deref().unwrap_or_default();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert_eq!(subjects[0].name, "quorumguard");
        assert_eq!(subjects[0].namespace.as_deref(), Some(NS));
    }
}

#[test]
fn every_rbac_rule_and_the_side_effects_choice_are_explained() {
    let rbac = fs::read_to_string(manifests_dir().join("core/rbac.yaml")).unwrap();
    let lines: Vec<&str> = rbac.lines().collect();
    let mut rules = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("- apiGroups:") {
            rules += 1;
            let above = lines[..i].last().map(|l| l.trim_start()).unwrap_or("");
            assert!(
                above.starts_with('#'),
                "rbac.yaml line {}: rule without a comment",
                i + 1
            );
        }
    }
    assert_eq!(rules, 8);
    assert!(
        rbac.contains("cannot restrict by a name pattern"),
        "why secrets are cluster-wide"
    );

    let vwc = fs::read_to_string(manifests_dir().join("core/validatingwebhookconfiguration.yaml"))
        .unwrap();
    let at = vwc.find("sideEffects: NoneOnDryRun").unwrap();
    let before_side_effects = &vwc[..vwc[..at].rfind('\n').unwrap()];
    let comment: String = before_side_effects
        .lines()
        .rev()
        .take_while(|l| l.trim_start().starts_with('#'))
        .collect();
    assert!(
        comment.contains("dryRun") && comment.contains("None"),
        "{comment}"
    );

    let readme = fs::read_to_string(manifests_dir().join("README.md")).unwrap();
    for needle in [
        "kubectl delete validatingwebhookconfiguration quorumguard",
        "quorumguard.io/allow-unsafe-delete",
        "failurePolicy",
        "Ignore",
        "#2651",
        "no-cert-manager",
        "quorumguard certs",
    ] {
        assert!(
            readme.contains(needle),
            "manifests/README.md mentions {needle}"
        );
    }
}

/// `manifests/with-client-auth/` (the client-auth component on the default install): serve
/// requires a client certificate naming kube-apiserver from a client CA of its own (only its
/// ca.crt mounted, never its key), cert-manager issues kube-apiserver's certificate from that CA
/// for client authentication, and nothing else changes.
#[test]
fn the_client_auth_component_requires_kube_apiservers_certificate_from_its_own_ca() {
    let base = default_render();
    let auth = Objects::load(&manifests_dir().join("with-client-auth"));
    let deployment: Deployment = auth.typed("Deployment", "quorumguard");
    let args = strings(&container(&deployment).args);
    for flag in [
        "--client-ca-file=/client-ca/ca.crt",
        "--client-name=kube-apiserver",
    ] {
        assert!(args.contains(&flag), "{flag} in {args:?}");
    }
    let volume = pod_spec(&deployment)
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|v| v.name == "client-ca")
        .and_then(|v| v.secret.clone())
        .expect("a client-ca Secret volume");
    assert_eq!(volume.secret_name.as_deref(), Some("quorumguard-client-ca"));
    let items: Vec<(String, String)> = volume
        .items
        .unwrap_or_default()
        .into_iter()
        .map(|i| (i.key, i.path))
        .collect();
    assert_eq!(
        items,
        [("ca.crt".to_owned(), "ca.crt".to_owned())],
        "never tls.key"
    );
    let mounted = container(&deployment)
        .volume_mounts
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|m| {
            m.name == "client-ca" && m.mount_path == "/client-ca" && m.read_only == Some(true)
        });
    assert!(mounted, "mounted read-only at /client-ca");

    let ca = auth.raw("Certificate", "quorumguard-client-ca");
    assert_eq!(ca["spec"]["isCA"], true);
    assert_eq!(ca["spec"]["secretName"], "quorumguard-client-ca");
    let issuer = auth.raw("Issuer", "quorumguard-client-ca");
    assert_eq!(issuer["spec"]["ca"]["secretName"], "quorumguard-client-ca");
    let client = auth.raw("Certificate", "quorumguard-apiserver-client");
    assert_eq!(client["spec"]["commonName"], "kube-apiserver");
    assert_eq!(client["spec"]["issuerRef"]["name"], "quorumguard-client-ca");
    assert_eq!(
        client["spec"]["usages"],
        serde_json::json!(["client auth", "digital signature"])
    );

    // Everything else is the default install.
    for o in &base.0 {
        let (kind, name) = (
            o["kind"].as_str().unwrap(),
            o["metadata"]["name"].as_str().unwrap(),
        );
        if kind != "Deployment" {
            assert_eq!(auth.find(kind, name), Some(o), "{kind}/{name}");
        }
    }
    assert_eq!(auth.0.len(), base.0.len() + 3);
}
