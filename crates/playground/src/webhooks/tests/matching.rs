//! Which writes are sent to which webhook: the configuration read, checked and matched.

use std::time::Duration;

use serde_json::{Value, json};

use super::{KCPS, MACHINES};
use crate::apiserver::{AdmissionAttempt, Operation};
use crate::webhooks::{
    MANIFEST, SERVICE_DNS_NAME, WebhookConfigError, WebhookDispatcher, WebhookTarget,
};

/// A self-signed CA certificate, only so that a target parses.
fn ca_pem() -> String {
    crate::certs::Ca::generate(1_800_000_000)
        .expect("CA")
        .cert_pem()
        .to_string()
}

fn target() -> WebhookTarget {
    WebhookTarget {
        addr: "127.0.0.1:9".parse().expect("addr"),
        ca_pem: ca_pem(),
        server_name: SERVICE_DNS_NAME.into(),
    }
}

fn repo() -> WebhookDispatcher {
    WebhookDispatcher::for_repo_manifest(target()).expect("the repo's manifest")
}

fn machine(namespace: &str, labels: Value) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
           "metadata": {"name": "m", "namespace": namespace, "labels": labels}})
}

fn control_plane() -> Value {
    json!({"cluster.x-k8s.io/control-plane": "", "cluster.x-k8s.io/cluster-name": "test"})
}

fn attempt(op: Operation, group: &str, resource: &str, sub: Option<&str>) -> AdmissionAttempt {
    AdmissionAttempt {
        operation: op,
        group: group.into(),
        version: "v1beta2".into(),
        resource: resource.into(),
        kind: "Thing".into(),
        sub_resource: sub.map(str::to_string),
        namespace: Some("capi-test".into()),
        name: "m".into(),
        object: None,
        old_object: None,
        user: "jane@example.com".into(),
        dry_run: false,
        options: None,
    }
}

fn machine_delete(namespace: &str, labels: Value) -> AdmissionAttempt {
    let mut a = attempt(Operation::Delete, "cluster.x-k8s.io", "machines", None);
    a.namespace = Some(namespace.into());
    a.old_object = Some(machine(namespace, labels));
    a
}

fn kcp_update(sub: Option<&str>) -> AdmissionAttempt {
    let mut a = attempt(
        Operation::Update,
        "controlplane.cluster.x-k8s.io",
        "kubeadmcontrolplanes",
        sub,
    );
    a.object = Some(json!({"metadata": {"name": "m"}, "spec": {"replicas": 5}}));
    a.old_object = Some(json!({"metadata": {"name": "m"}, "spec": {"replicas": 3}}));
    a
}

/// A one-webhook configuration with these rules and selectors (YAML fragments).
fn custom(rules: &str, extra: &str) -> WebhookDispatcher {
    let yaml = format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: custom}}
webhooks:
  - name: custom.example.io
    admissionReviewVersions: ["v1"]
    sideEffects: None
    clientConfig: {{service: {{name: svc, namespace: ns, path: /x}}}}
    rules: {rules}
{extra}
"#
    );
    WebhookDispatcher::from_manifest(&yaml, target()).expect("custom configuration")
}

fn sent(d: &WebhookDispatcher, a: &AdmissionAttempt) -> bool {
    !d.matching(a).is_empty()
}

#[test]
fn the_repo_manifest_parses_with_its_settings() {
    let d = repo();
    assert_eq!(d.name(), "quorumguard");
    assert_eq!(d.webhook_names(), [MACHINES, KCPS]);
    let urls: Vec<_> = d.hooks.iter().map(|h| h.url.as_str()).collect();
    assert_eq!(
        urls,
        [
            "https://quorumguard-webhook.quorumguard-system.svc:443/validate/machines?timeout=5s",
            "https://quorumguard-webhook.quorumguard-system.svc:443/validate/kubeadmcontrolplanes?timeout=5s",
        ]
    );
    assert!(d.hooks.iter().all(|h| !h.fail_open));
    assert!(d.hooks.iter().all(|h| h.timeout == Duration::from_secs(5)));
}

#[test]
fn the_repo_manifest_sends_control_plane_deletes_and_kcp_spec_updates_only() {
    let d = repo();
    assert_eq!(
        d.matching(&machine_delete("capi-test", control_plane())),
        [MACHINES]
    );
    // A worker Machine has no control-plane label: never sent.
    let worker = json!({"cluster.x-k8s.io/cluster-name": "test"});
    assert!(d.matching(&machine_delete("capi-test", worker)).is_empty());
    // The guard's own namespace is never guarded.
    assert!(
        d.matching(&machine_delete("quorumguard-system", control_plane()))
            .is_empty()
    );
    // Only DELETE of Machines.
    let mut update = machine_delete("capi-test", control_plane());
    update.operation = Operation::Update;
    update.object = update.old_object.clone();
    assert!(d.matching(&update).is_empty());
    let mut create = machine_delete("capi-test", control_plane());
    create.operation = Operation::Create;
    create.object = create.old_object.take();
    assert!(d.matching(&create).is_empty());
    // The KCP: the resource and /scale, never /status; only UPDATE.
    assert_eq!(d.matching(&kcp_update(None)), [KCPS]);
    assert_eq!(d.matching(&kcp_update(Some("scale"))), [KCPS]);
    assert!(d.matching(&kcp_update(Some("status"))).is_empty());
    let mut kcp_delete = kcp_update(None);
    kcp_delete.operation = Operation::Delete;
    assert!(d.matching(&kcp_delete).is_empty());
    let mut kcp_elsewhere = kcp_update(Some("scale"));
    kcp_elsewhere.namespace = Some("quorumguard-system".into());
    assert!(d.matching(&kcp_elsewhere).is_empty());
}

#[test]
fn the_object_selector_reads_the_old_object_on_delete_and_either_on_update() {
    let d = custom(
        r#"[{operations: ["*"], apiGroups: ["*"], apiVersions: ["*"], resources: ["*"]}]"#,
        "    objectSelector: {matchLabels: {tier: cp}}",
    );
    let cp = json!({"tier": "cp"});
    // DELETE: object is absent, the stored object's labels decide.
    assert!(sent(&d, &machine_delete("capi-test", cp.clone())));
    assert!(!sent(&d, &machine_delete("capi-test", json!({}))));
    // UPDATE: either the old or the new object may match (a label removed or added).
    let mut a = attempt(Operation::Update, "cluster.x-k8s.io", "machines", None);
    a.old_object = Some(machine("capi-test", cp.clone()));
    a.object = Some(machine("capi-test", json!({})));
    assert!(sent(&d, &a));
    std::mem::swap(&mut a.object, &mut a.old_object);
    assert!(sent(&d, &a));
    a.old_object = Some(machine("capi-test", json!({"tier": "worker"})));
    a.object = Some(machine("capi-test", json!({})));
    assert!(!sent(&d, &a));
    // CREATE: the new object only.
    let mut c = attempt(Operation::Create, "cluster.x-k8s.io", "machines", None);
    c.object = Some(machine("capi-test", cp));
    assert!(sent(&d, &c));
}

#[test]
fn resources_and_subresources_match_as_the_apiserver_splits_them() {
    let rules = |resources: &str| {
        custom(
            &format!(
                r#"[{{operations: ["UPDATE"], apiGroups: ["cluster.x-k8s.io"], apiVersions: ["v1beta2"], resources: {resources}}}]"#
            ),
            "",
        )
    };
    let main = attempt(Operation::Update, "cluster.x-k8s.io", "machines", None);
    let status = attempt(
        Operation::Update,
        "cluster.x-k8s.io",
        "machines",
        Some("status"),
    );
    let scale = attempt(
        Operation::Update,
        "cluster.x-k8s.io",
        "machines",
        Some("scale"),
    );
    let other = attempt(Operation::Update, "cluster.x-k8s.io", "clusters", None);
    let cases = [
        (r#"["machines"]"#, [true, false, false, false]),
        (r#"["*"]"#, [true, false, false, true]),
        (r#"["*/*"]"#, [true, true, true, true]),
        // As k8s.io/apiserver's matcher has it, `r/*` includes `r` itself.
        (r#"["machines/*"]"#, [true, true, true, false]),
        (r#"["*/status"]"#, [false, true, false, false]),
        (
            r#"["machines", "machines/scale"]"#,
            [true, false, true, false],
        ),
    ];
    for (resources, want) in cases {
        let d = rules(resources);
        let got = [&main, &status, &scale, &other].map(|a| sent(&d, a));
        assert_eq!(got, want, "{resources}");
    }
    // Group and version must match too.
    let d = rules(r#"["*/*"]"#);
    let mut core = main.clone();
    core.group = String::new();
    assert!(!sent(&d, &core));
    let mut v1 = main.clone();
    v1.version = "v1beta1".into();
    assert!(!sent(&d, &v1));
}

#[test]
fn operations_and_scope() {
    let d = custom(
        r#"[{operations: ["*"], apiGroups: ["*"], apiVersions: ["*"], resources: ["*"], scope: Cluster}]"#,
        "",
    );
    let mut a = attempt(Operation::Create, "cluster.x-k8s.io", "machines", None);
    assert!(!sent(&d, &a), "namespaced request, Cluster scope");
    a.namespace = None;
    assert!(sent(&d, &a));
    for op in [Operation::Update, Operation::Delete] {
        a.operation = op;
        assert!(sent(&d, &a), "{op:?} under *");
    }
    let d = custom(
        r#"[{operations: ["CREATE"], apiGroups: [""], apiVersions: ["*"], resources: ["*"], scope: Namespaced}]"#,
        "",
    );
    let mut ns = attempt(Operation::Create, "", "namespaces", None);
    ns.namespace = Some("capi-test".into());
    assert!(!sent(&d, &ns), "a Namespace is cluster-scoped");
    let mut secret = attempt(Operation::Create, "", "secrets", None);
    assert!(sent(&d, &secret));
    secret.operation = Operation::Delete;
    assert!(!sent(&d, &secret));
}

#[test]
fn selector_operators() {
    let d = custom(
        r#"[{operations: ["*"], apiGroups: ["*"], apiVersions: ["*"], resources: ["*"]}]"#,
        r#"    objectSelector:
      matchLabels: {a: "1"}
      matchExpressions:
        - {key: b, operator: In, values: ["x", "y"]}
        - {key: c, operator: NotIn, values: ["no"]}
        - {key: d, operator: Exists}
        - {key: e, operator: DoesNotExist}
    namespaceSelector:
      matchExpressions:
        - {key: kubernetes.io/metadata.name, operator: In, values: ["capi-test"]}"#,
    );
    let with = |labels: Value| sent(&d, &machine_delete("capi-test", labels));
    assert!(with(json!({"a": "1", "b": "y", "d": ""})));
    assert!(with(json!({"a": "1", "b": "x", "c": "yes", "d": "z"})));
    assert!(!with(json!({"a": "2", "b": "x", "d": ""})), "matchLabels");
    assert!(!with(json!({"a": "1", "b": "z", "d": ""})), "In");
    assert!(!with(json!({"a": "1", "d": ""})), "In needs the label");
    assert!(
        !with(json!({"a": "1", "b": "x", "c": "no", "d": ""})),
        "NotIn"
    );
    assert!(!with(json!({"a": "1", "b": "x"})), "Exists");
    assert!(
        !with(json!({"a": "1", "b": "x", "d": "", "e": ""})),
        "DoesNotExist"
    );
    // The namespace selector sees kubernetes.io/metadata.name only.
    let labels = json!({"a": "1", "b": "y", "d": ""});
    assert!(!sent(&d, &machine_delete("default", labels.clone())));
    // A cluster-scoped request is never exempted by a namespace selector.
    let mut cluster_scoped = machine_delete("capi-test", labels);
    cluster_scoped.namespace = None;
    assert!(sent(&d, &cluster_scoped));
}

#[test]
fn configurations_this_dispatcher_cannot_honour_are_refused() {
    let base = MANIFEST.to_string();
    let bad = [
        (
            base.replace(
                "        name: quorumguard-webhook\n        namespace: quorumguard-system\n        path: /validate/machines",
                "        name: elsewhere\n        namespace: quorumguard-system\n        path: /validate/machines",
            ),
            "one target serves all webhooks",
        ),
        (
            base.replacen("sideEffects: NoneOnDryRun", "sideEffects: Some", 1),
            "sideEffects",
        ),
        (
            base.replacen(
                "admissionReviewVersions: [\"v1\"]",
                "admissionReviewVersions: [\"v1beta1\", \"v1\"]",
                1,
            ),
            "only v1",
        ),
        (
            base.replacen("failurePolicy: Fail", "failurePolicy: Maybe", 1),
            "failurePolicy",
        ),
        (
            base.replacen("timeoutSeconds: 5", "timeoutSeconds: 31", 1),
            "timeoutSeconds",
        ),
        (
            base.replacen("operator: Exists", "operator: Exists\n          values: [x]", 1),
            "objectSelector",
        ),
        (
            base.replacen(
                "    clientConfig:\n      service:",
                "    clientConfig:\n      url: https://example.com/x\n      service:",
                1,
            ),
            "clientConfig.url",
        ),
        (
            base.replacen(
                "- name: kubeadmcontrolplanes.quorumguard.io",
                "- name: machines.quorumguard.io",
                1,
            ),
            "unique",
        ),
    ];
    for (yaml, needle) in bad {
        assert_ne!(yaml, base, "{needle}: the edit applied");
        let err = WebhookDispatcher::from_manifest(&yaml, target())
            .err()
            .unwrap_or_else(|| panic!("{needle}: accepted"));
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    let mut no_ca = target();
    no_ca.ca_pem = "not a certificate".into();
    assert!(matches!(
        WebhookDispatcher::for_repo_manifest(no_ca),
        Err(WebhookConfigError::CaBundle(_))
    ));
    assert!(matches!(
        WebhookDispatcher::from_manifest("kind: ConfigMap\napiVersion: v1\n", target()),
        Err(WebhookConfigError::Parse(_))
    ));
}
