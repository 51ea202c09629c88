//! The monitoring component (`manifests/monitoring/`, issue 18), checked so that a wrong rule or a
//! renamed metric breaks a test instead of a pager:
//!
//! - it renders on top of the default install (`kubectl kustomize manifests/with-monitoring/`),
//!   adds only its three objects, and its ServiceMonitor scrapes Service `quorumguard-metrics`
//!   with `honorLabels` (the rules group by the workload Cluster's `namespace`);
//! - `promtool check rules` and `promtool test rules` on the PrometheusRule's groups with the
//!   unit tests in `manifests/monitoring/tests/` (each alert fires after its `for` and stays
//!   silent on the healthy and transient cases);
//! - every alert has a severity, a summary and description naming the namespace (and cluster), a
//!   `runbook_url` to its own section of `docs/runbook.md`, and the runbook names only codes
//!   the engine has;
//! - every metric, label and label value that the rules and the dashboard's queries use exists
//!   in the `/metrics` of a running `serve` that has probed a real 3-member etcd cluster (TLS on
//!   loopback) through the API-server stand-in for two control planes (one whose rollout would
//!   stick), runs the autopilot in dry-run, holds the Lease, and has answered a denial and a break-glass review (and the
//!   rollout verdicts and reasons the component names are the guard's); then promtool evaluates every dashboard query and every selector on
//!   those series, as Prometheus would store them from the ServiceMonitor, and each must
//!   return data.
//!
//! Needs `promtool` (Debian's `prometheus`, installed by scripts/deps.sh). Without `kubectl` the
//! component's files are read as they are (their kustomization only lists them and generates the
//! dashboard ConfigMap), and the render test says so.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use quorumguard::engine::Reason;
use quorumguard::engine::autopilot::{Mode, Settings};
use quorumguard::engine::rollout::ReadyReason;
use quorumguard::lease::LeaseConfig;
use quorumguard::server::autopilot::AutopilotConfig;
use quorumguard::server::{self, Running, StatusConfig};
use quorumguard::status::metrics::RolloutVerdict;
use quorumguard::status::publish::PublishConfig;
use quorumguard::status::{CONDITION_ETCD_QUORUM, QuorumReason};
use serde_json::{Value, json};
use testkit::apiserver::{ApiServer, kcp_resource};
use testkit::etcd::EtcdCluster;
use testkit::guard::{self, MACHINES};
use testkit::https::{TempDir, TestPki, try_get_plain};
use testkit::manifests::parse_yaml;
use testkit::reviews::NS;
use testkit::seed;

/// Where every `runbook_url` points (a section anchor is appended).
const RUNBOOK_URL: &str = "https://github.com/quorumguard/quorumguard/blob/main/docs/runbook.md";
/// The job label of the ServiceMonitor's targets (the Service's name) and the guard's namespace.
const JOB: &str = "quorumguard-metrics";
const GUARD_NS: &str = "quorumguard-system";
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// The workload cluster whose rollout would stick, beside the fixtures' `test`.
const STUCK: &str = "stuck";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn monitoring_dir() -> PathBuf {
    root().join("manifests/monitoring")
}

/// A program from /usr/bin or PATH.
fn tool(name: &str) -> Option<PathBuf> {
    let usr = PathBuf::from("/usr/bin").join(name);
    if usr.is_file() {
        return Some(usr);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn promtool() -> PathBuf {
    tool("promtool").unwrap_or_else(|| {
        panic!(
            "promtool not found (/usr/bin or PATH): install Debian's prometheus package \
             (scripts/deps.sh does)"
        )
    })
}

/// Runs `cmd` in `dir` with its output in files (no pipe to fill), killed after
/// [`TOOL_TIMEOUT`]. Returns the exit status and stdout followed by stderr.
fn run(mut cmd: Command, dir: &Path, what: &str) -> (ExitStatus, String) {
    let out = dir.join(format!("{what}.out"));
    let err = dir.join(format!("{what}.err"));
    let mut child = cmd
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).expect("stdout file"))
        .stderr(fs::File::create(&err).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let deadline = Instant::now() + TOOL_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} took over {TOOL_TIMEOUT:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let text = fs::read_to_string(&out).unwrap_or_default()
        + &fs::read_to_string(&err).unwrap_or_default();
    (status, text)
}

/// `kubectl kustomize DIR`, or `None` without kubectl (or with
/// `QUORUMGUARD_TEST_MANIFESTS_RAW` set, as for tests/it/manifests.rs).
fn kustomize(dir: &str) -> Option<Vec<Value>> {
    if std::env::var_os("QUORUMGUARD_TEST_MANIFESTS_RAW").is_some() {
        return None;
    }
    let kubectl = tool("kubectl")?;
    let tmp = TempDir::new("kustomize");
    let mut cmd = Command::new(kubectl);
    cmd.arg("kustomize").arg(root().join(dir));
    let (status, out) = run(cmd, tmp.path(), "kustomize");
    assert!(status.success(), "kubectl kustomize {dir} failed:\n{out}");
    Some(parse_yaml(&out))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind}/{name} is not rendered"))
}

/// The component's three objects: rendered with the default install, or read from its files.
struct Component {
    service_monitor: Value,
    rule: Value,
    dashboard_configmap: Value,
}

impl Component {
    fn load() -> Component {
        match kustomize("manifests/with-monitoring") {
            Some(objects) => Component {
                service_monitor: find(&objects, "ServiceMonitor", "quorumguard").clone(),
                rule: find(&objects, "PrometheusRule", "quorumguard").clone(),
                dashboard_configmap: find(&objects, "ConfigMap", "quorumguard-dashboard").clone(),
            },
            None => {
                let read = |f: &str| {
                    let text = fs::read_to_string(monitoring_dir().join(f)).expect(f);
                    parse_yaml(&text).remove(0)
                };
                let dashboard =
                    fs::read_to_string(monitoring_dir().join("dashboard.json")).expect("json");
                Component {
                    service_monitor: read("servicemonitor.yaml"),
                    rule: read("prometheusrule.yaml"),
                    dashboard_configmap: json!({
                        "metadata": {"name": "quorumguard-dashboard", "namespace": GUARD_NS,
                                     "labels": {"grafana_dashboard": "1"}},
                        "data": {"quorumguard.json": dashboard},
                    }),
                }
            }
        }
    }

    fn alerts(&self) -> Vec<&Value> {
        self.rule["spec"]["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().expect("rules"))
            .filter(|r| r.get("alert").is_some())
            .collect()
    }

    fn dashboard(&self) -> Value {
        let data = self.dashboard_configmap["data"]
            .as_object()
            .expect("ConfigMap data");
        assert_eq!(data.len(), 1, "one dashboard per ConfigMap");
        let (key, text) = data.iter().next().expect("a key");
        assert!(key.ends_with(".json"), "the sidecar loads *.json: {key}");
        let text = text.as_str().expect("a string");
        assert!(
            text.len() < 256 * 1024,
            "kubectl apply keeps a last-applied copy in an annotation (256 KiB at most)"
        );
        serde_json::from_str(text).unwrap_or_else(|e| panic!("dashboard JSON: {e}"))
    }
}

/// Every panel with queries, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(p) = stack.pop() {
        if let Some(nested) = p["panels"].as_array() {
            stack.extend(nested);
        }
        if p["type"] != "row" {
            out.push(p);
        }
    }
    out
}

/// A query of the dashboard: where it is, its PromQL and the labels its legend uses.
struct Query {
    place: String,
    expr: String,
    legend_labels: Vec<String>,
}

/// Every panel target and every `label_values(SELECTOR, LABEL)` variable query, with the
/// dashboard's variables replaced by what they stand for (query variables by `.*`, as "All").
fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    let mut vars = BTreeMap::new();
    let mut queries = Vec::new();
    for v in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        let name = v["name"].as_str().expect("name").to_string();
        match v["type"].as_str() {
            Some("query") => {
                let q = v["query"]["query"].as_str().expect("variable query");
                let inner = q
                    .strip_prefix("label_values(")
                    .and_then(|s| s.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("variable {name}: label_values(...) expected"));
                let (selector, label) = inner.rsplit_once(',').expect("label_values(sel, label)");
                queries.push(Query {
                    place: format!("variable {name}"),
                    expr: selector.trim().to_string(),
                    legend_labels: vec![label.trim().to_string()],
                });
                vars.insert(name, ".*".to_string());
            }
            Some("custom") | Some("constant") => {
                let value = v["current"]["value"].as_str().expect("current value");
                vars.insert(name, value.to_string());
            }
            _ => {}
        }
    }
    for p in panels(dashboard) {
        let title = p["title"].as_str().unwrap_or("(untitled)");
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{title}: no expr"));
            let legend = t["legendFormat"].as_str().unwrap_or_default();
            queries.push(Query {
                place: format!("panel {title:?} {}", t["refId"]),
                expr: expr.to_string(),
                legend_labels: template_labels(legend, "{{", "}}"),
            });
        }
    }
    for q in &mut queries {
        q.expr = substitute(&q.expr, &vars);
    }
    queries
}

/// Grafana's variables in `expr`: `$__rate_interval` and friends by a duration, `$name` and
/// `${name}` by `vars`.
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = expr
        .replace("$__rate_interval", "2m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h");
    for (name, value) in vars {
        out = out
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    assert!(!out.contains('$'), "unknown variable in {expr:?}");
    out
}

/// The label names a template uses: `{{ $labels.x }}` in alerts, `{{x}}` in legends.
fn template_labels(text: &str, open: &str, close: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(close) else { break };
        let inner = after[..end].trim();
        let name = inner.strip_prefix("$labels.").unwrap_or(inner);
        let name = name.split_whitespace().next().unwrap_or_default();
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(name.to_string());
        }
        rest = &after[end + close.len()..];
    }
    out
}

mod promql {
    //! Just enough of PromQL to find what an expression reads: its vector selectors (metric
    //! name and label matchers) and the labels its `by`/`on`/... clauses name.

    #[derive(Clone, Debug, PartialEq)]
    enum Tok {
        Ident(String),
        Str(String),
        Num,
        Punct(char),
        Op(String),
    }

    fn tokens(expr: &str) -> Vec<Tok> {
        let c: Vec<char> = expr.chars().collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < c.len() {
            let ch = c[i];
            if ch.is_whitespace() {
                i += 1;
            } else if ch == '#' {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            } else if ch == '"' || ch == '\'' || ch == '`' {
                let mut s = String::new();
                i += 1;
                while i < c.len() && c[i] != ch {
                    if c[i] == '\\' && ch != '`' {
                        i += 1;
                    }
                    if let Some(&x) = c.get(i) {
                        s.push(x);
                    }
                    i += 1;
                }
                i += 1;
                out.push(Tok::Str(s));
            } else if ch.is_ascii_digit()
                || (ch == '.' && c.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
            {
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                    i += 1;
                }
                out.push(Tok::Num);
            } else if ch.is_ascii_alphabetic() || ch == '_' {
                let start = i;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_' || c[i] == ':') {
                    i += 1;
                }
                out.push(Tok::Ident(c[start..i].iter().collect()));
            } else if "(){}[],".contains(ch) {
                out.push(Tok::Punct(ch));
                i += 1;
            } else {
                let start = i;
                while i < c.len() && "=!~<>+-*/%^:".contains(c[i]) {
                    i += 1;
                }
                assert!(i > start, "unexpected {ch:?} in {expr:?}");
                out.push(Tok::Op(c[start..i].iter().collect()));
            }
        }
        out
    }

    /// A vector selector: the metric name and `(label, op, value)` matchers.
    #[derive(Clone, Debug, PartialEq)]
    pub struct Selector {
        pub name: String,
        pub matchers: Vec<(String, String, String)>,
    }

    impl Selector {
        /// The selector as PromQL.
        pub fn text(&self) -> String {
            let m: Vec<String> = self
                .matchers
                .iter()
                .map(|(l, op, v)| format!("{l}{op}{v:?}"))
                .collect();
            format!("{}{{{}}}", self.name, m.join(", "))
        }
    }

    const GROUPING: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: [&str; 6] = ["and", "or", "unless", "bool", "offset", "atan2"];
    const AGGREGATIONS: [&str; 12] = [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];

    /// The selectors of `expr` and the label names of its grouping clauses.
    pub fn read(expr: &str) -> (Vec<Selector>, Vec<String>) {
        let t = tokens(expr);
        let (mut selectors, mut grouping) = (Vec::new(), Vec::new());
        let mut i = 0;
        while i < t.len() {
            match &t[i] {
                Tok::Ident(id) if GROUPING.contains(&id.as_str()) => {
                    i += 1;
                    if t.get(i) == Some(&Tok::Punct('(')) {
                        i += 1;
                        while i < t.len() && t[i] != Tok::Punct(')') {
                            if let Tok::Ident(l) = &t[i] {
                                grouping.push(l.clone());
                            }
                            i += 1;
                        }
                        i += 1;
                    }
                }
                Tok::Ident(id) if KEYWORDS.contains(&id.as_str()) => i += 1,
                Tok::Ident(id) if AGGREGATIONS.contains(&id.as_str()) => i += 1,
                Tok::Ident(_) if t.get(i + 1) == Some(&Tok::Punct('(')) => i += 1,
                Tok::Ident(name) => {
                    let mut s = Selector {
                        name: name.clone(),
                        matchers: Vec::new(),
                    };
                    i += 1;
                    if t.get(i) == Some(&Tok::Punct('{')) {
                        i = matchers(&t, i + 1, &mut s.matchers, expr);
                    }
                    selectors.push(s);
                }
                Tok::Punct('{') => {
                    let mut m = Vec::new();
                    i = matchers(&t, i + 1, &mut m, expr);
                    let name = m
                        .iter()
                        .position(|(l, op, _)| l == "__name__" && op == "=")
                        .map(|p| m.remove(p).2)
                        .unwrap_or_else(|| panic!("a selector without a metric name in {expr:?}"));
                    selectors.push(Selector { name, matchers: m });
                }
                Tok::Punct('[') => {
                    while i < t.len() && t[i] != Tok::Punct(']') {
                        i += 1;
                    }
                    i += 1;
                }
                _ => i += 1,
            }
        }
        (selectors, grouping)
    }

    fn matchers(
        t: &[Tok],
        mut i: usize,
        out: &mut Vec<(String, String, String)>,
        expr: &str,
    ) -> usize {
        loop {
            match (t.get(i), t.get(i + 1), t.get(i + 2)) {
                (Some(Tok::Punct('}')), _, _) => return i + 1,
                (Some(Tok::Punct(',')), _, _) => i += 1,
                (Some(Tok::Ident(l)), Some(Tok::Op(op)), Some(Tok::Str(v))) => {
                    out.push((l.clone(), op.clone(), v.clone()));
                    i += 3;
                }
                other => panic!("cannot read the matchers of {expr:?} at {other:?}"),
            }
        }
    }

    #[test]
    fn reads_selectors_and_grouping_labels() {
        let (s, g) = read(
            "max by (namespace, cluster) (rate(a_total{x=\"1\", y=~\"b|c\"}[5m] offset 1m)) \
             / on (job) group_left b unless {__name__=\"c\", z!=\"\"} > bool 0.5",
        );
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a_total", "b", "c"]);
        assert_eq!(s[0].matchers[1], ("y".into(), "=~".into(), "b|c".into()));
        assert_eq!(s[2].matchers, [("z".into(), "!=".into(), String::new())]);
        assert_eq!(g, ["namespace", "cluster", "job"]);
    }
}

/// The GitHub anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn runbook() -> String {
    fs::read_to_string(root().join("docs/runbook.md")).expect("docs/runbook.md")
}

/// The next-action codes, as the engine writes them (`ActionCode::X => "X"`).
fn action_codes() -> BTreeSet<String> {
    let src =
        fs::read_to_string(root().join("crates/engine/src/next_action/mod.rs")).expect("engine");
    let codes: BTreeSet<String> = src
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ActionCode::"))
        .filter_map(|l| l.split_once(" => \""))
        .map(|(_, s)| s.trim_end_matches(['"', ',']).to_string())
        .collect();
    assert!(
        codes.len() >= 10 && codes.contains("RestoreQuorum"),
        "{codes:?}"
    );
    codes
}

#[test]
fn the_component_renders_on_top_of_the_default_install() {
    let (Some(base), Some(with)) = (
        kustomize("manifests"),
        kustomize("manifests/with-monitoring"),
    ) else {
        eprintln!("monitoring test: kubectl not found: the render with the base is not checked");
        return;
    };
    let key = |o: &Value| {
        (
            o["kind"].as_str().unwrap_or_default().to_string(),
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    };
    for o in &base {
        let same = with.iter().find(|w| key(w) == key(o));
        assert_eq!(
            same,
            Some(o),
            "{:?} differs or is missing with monitoring",
            key(o)
        );
    }
    let added: BTreeSet<_> = with
        .iter()
        .filter(|w| !base.iter().any(|o| key(o) == key(w)))
        .map(key)
        .collect();
    let expected: BTreeSet<_> = [
        ("ConfigMap", "quorumguard-dashboard"),
        ("PrometheusRule", "quorumguard"),
        ("ServiceMonitor", "quorumguard"),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), n.to_string()))
    .collect();
    assert_eq!(
        added, expected,
        "the component adds exactly its three objects"
    );
    for (kind, name) in &expected {
        assert_eq!(
            find(&with, kind, name)["metadata"]["namespace"],
            GUARD_NS,
            "{kind}/{name}"
        );
    }

    // The ServiceMonitor selects Service quorumguard-metrics and no other target.
    let sm = find(&with, "ServiceMonitor", "quorumguard");
    assert_eq!(sm, &Component::load().service_monitor);
    let selector = sm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"],
        json!([GUARD_NS])
    );
    let endpoints = sm["spec"]["endpoints"].as_array().expect("endpoints");
    assert_eq!(endpoints.len(), 1);
    let ep = &endpoints[0];
    assert_eq!(
        ep["honorLabels"], true,
        "per-cluster series keep their namespace"
    );
    assert_eq!(ep["path"], "/metrics");
    let scraped: Vec<&str> = with
        .iter()
        .filter(|o| o["kind"] == "Service" && o["metadata"]["namespace"] == GUARD_NS)
        .filter(|s| {
            selector
                .iter()
                .all(|(k, v)| &s["metadata"]["labels"][k] == v)
        })
        .filter(|s| {
            s["spec"]["ports"]
                .as_array()
                .is_some_and(|ports| ports.iter().any(|p| p["name"] == ep["port"]))
        })
        .map(|s| s["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(scraped, [JOB], "the job label is the Service's name");
    // ... and that Service reaches the admin port, where /metrics is served.
    let svc = find(&with, "Service", JOB);
    let port = svc["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == ep["port"])
        .expect("port");
    assert_eq!(port["targetPort"], "admin");

    // The dashboard ConfigMap, for the Grafana sidecar.
    let cm = find(&with, "ConfigMap", "quorumguard-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(&Component::load().dashboard_configmap, cm);
}

/// With or without kubectl: the scrape keeps the workload Cluster's `namespace` label.
#[test]
fn the_service_monitor_honours_the_clusters_namespace_label() {
    let sm = Component::load().service_monitor;
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true);
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
}

#[test]
fn the_dashboard_parses_and_every_panel_queries_prometheus() {
    let d = Component::load().dashboard();
    assert_eq!(d["uid"], "quorumguard");
    let mut ids = BTreeSet::new();
    for p in panels(&d) {
        let title = p["title"].as_str().expect("title");
        assert!(
            ids.insert(p["id"].as_i64().expect("id")),
            "duplicate id: {title}"
        );
        assert_eq!(p["datasource"]["type"], "prometheus", "{title}");
        assert!(p["gridPos"]["w"].as_i64().is_some(), "{title}: gridPos");
        for t in p["targets"].as_array().expect("targets") {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(t["refId"].is_string(), "{title}: refId");
        }
    }
    // The panels the issue asks for.
    let titles: Vec<String> = panels(&d)
        .iter()
        .map(|p| p["title"].as_str().expect("title").to_lowercase())
        .collect();
    for wanted in [
        "etcdquorum state",
        "quorum margin",
        "members by state",
        "probe duration",
        "sweep vs",
        "by verdict and reason",
        "admission latency",
        "lease holder",
        "certificate expires",
        "rollout readiness",
        "by rollout verdict",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(wanted)),
            "no panel about {wanted:?}: {titles:?}"
        );
    }
    assert!(dashboard_queries(&d).len() > 20);
}

#[test]
fn every_alert_is_labelled_annotated_and_has_its_runbook_section() {
    let c = Component::load();
    let runbook = runbook();
    let sections: BTreeMap<String, String> = runbook
        .split("\n## ")
        .skip(1)
        .map(|s| {
            let (heading, body) = s.split_once('\n').unwrap_or((s, ""));
            (heading.trim().to_string(), body.to_string())
        })
        .collect();
    let mut names = BTreeSet::new();
    for a in c.alerts() {
        let name = a["alert"].as_str().expect("alert name");
        names.insert(name.to_string());
        let severity = a["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        let ann = &a["annotations"];
        let (summary, description) = (
            ann["summary"].as_str().unwrap_or_default(),
            ann["description"].as_str().unwrap_or_default(),
        );
        assert!(
            !summary.is_empty() && !description.is_empty(),
            "{name}: summary, description"
        );
        let text = format!("{summary} {description}");
        let expr = a["expr"].as_str().expect("expr");
        let per_cluster = expr.contains("by (namespace, cluster)");
        for label in ["namespace", "cluster"] {
            if label == "namespace" || per_cluster {
                assert!(
                    summary.contains(&format!("$labels.{label}"))
                        && description.contains(&format!("$labels.{label}")),
                    "{name}: summary and description must name the {label}"
                );
            }
        }
        assert!(
            !text.contains("{{ $labels.cluster }}") || per_cluster,
            "{name}"
        );
        let url = ann["runbook_url"].as_str().unwrap_or_default();
        let section = url
            .strip_prefix(RUNBOOK_URL)
            .and_then(|s| s.strip_prefix('#'))
            .unwrap_or_else(|| panic!("{name}: runbook_url {url:?} is not {RUNBOOK_URL}#..."));
        assert_eq!(section, anchor(name), "{name}: its own section");
        let body = sections
            .iter()
            .find(|(h, _)| anchor(h) == section)
            .map(|(_, b)| b)
            .unwrap_or_else(|| panic!("docs/runbook.md has no section {name}"));
        for part in ["What it means", "Confirm", "What to do", "Never"] {
            assert!(body.contains(part), "runbook section {name} lacks {part:?}");
        }
    }
    assert!(names.len() >= 11, "{names:?}");
    let alert_sections: BTreeSet<String> = sections
        .keys()
        .filter(|h| h.starts_with("QuorumGuard"))
        .cloned()
        .collect();
    assert_eq!(
        alert_sections, names,
        "one runbook section per alert, no other"
    );

    // Codes the runbook names (`CamelCase` in backticks) are the engine's: next actions,
    // admission reasons, EtcdQuorum reasons; or an alert.
    let mut known = action_codes();
    known.extend(Reason::ALL.iter().map(|r| r.as_str().to_string()));
    known.extend(QuorumReason::ALL.iter().map(|r| r.as_str().to_string()));
    known.extend(ReadyReason::ALL.iter().map(|r| r.as_str().to_string()));
    known.extend(names.iter().cloned());
    // Kinds and Cluster API's own names the runbook may quote.
    known.extend(
        [
            "KubeadmControlPlane",
            "MachineHealthCheck",
            "CertificateRequest",
            "ServiceMonitor",
        ]
        .map(String::from),
    );
    let mut unknown = BTreeSet::new();
    for (i, chunk) in runbook.split('`').enumerate() {
        let camel = chunk.len() > 3
            && chunk.starts_with(|c: char| c.is_ascii_uppercase())
            && chunk.chars().all(|c| c.is_ascii_alphanumeric())
            && chunk.chars().any(|c| c.is_ascii_lowercase())
            && chunk.chars().skip(1).any(|c| c.is_ascii_uppercase());
        if i % 2 == 1 && camel && !known.contains(chunk) {
            unknown.insert(chunk.to_string());
        }
    }
    assert!(
        unknown.is_empty(),
        "codes in docs/runbook.md the engine lacks: {unknown:?}"
    );
}

/// The `verdict` and `reason` values of `quorumguard_rollout_ready` that the rules, the dashboard
/// and the promtool tests name are ones serve exports (a misspelt value matches nothing, and
/// an alert on it never fires).
#[test]
fn rollout_label_values_are_the_guards() {
    let verdicts: BTreeSet<&str> = RolloutVerdict::ALL.iter().map(|v| v.as_str()).collect();
    let reasons: BTreeSet<&str> = ReadyReason::ALL.iter().map(|r| r.as_str()).collect();
    let dir = monitoring_dir();
    let mut files = vec![dir.join("prometheusrule.yaml"), dir.join("dashboard.json")];
    files.extend(
        fs::read_dir(dir.join("tests"))
            .expect("tests dir")
            .map(|e| e.expect("entry").path()),
    );
    let mut named = 0;
    for f in files {
        let text = fs::read_to_string(&f).expect("read").replace("\\\"", "\"");
        for line in text
            .lines()
            .filter(|l| l.contains("quorumguard_rollout_ready"))
        {
            for (label, known) in [("verdict", &verdicts), ("reason", &reasons)] {
                for (at, _) in line.match_indices(label) {
                    let rest = line[at + label.len()..].trim_start_matches(['!', '=', '~']);
                    let Some(value) = rest.strip_prefix('"') else {
                        continue;
                    };
                    let value = value.split('"').next().unwrap_or_default();
                    named += 1;
                    assert!(
                        known.contains(value),
                        "{}: {label} {value:?} is not one serve exports ({known:?})",
                        f.display()
                    );
                }
            }
        }
    }
    assert!(named >= 8, "{named} values checked");
}

/// `promtool check rules` and `promtool test rules` on the PrometheusRule's groups, with every
/// unit test file of the component.
#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    let promtool = promtool();
    let c = Component::load();
    let dir = TempDir::new("promtool");
    let rules = serde_yaml::to_string(&c.rule["spec"]).expect("yaml");
    fs::write(dir.path().join("quorumguard-rules.yaml"), rules).expect("write rules");

    let mut check = Command::new(&promtool);
    check.args(["check", "rules", "quorumguard-rules.yaml"]);
    let (status, out) = run(check, dir.path(), "check");
    assert!(status.success(), "promtool check rules:\n{out}");

    let tests_dir = monitoring_dir().join("tests");
    let mut files: Vec<PathBuf> = fs::read_dir(&tests_dir)
        .expect("tests dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no promtool tests in {}",
        tests_dir.display()
    );

    // Every alert is shown firing in some test, and silent in another.
    let (mut fires, mut silent) = (BTreeSet::new(), BTreeSet::new());
    let mut test = Command::new(&promtool);
    test.args(["test", "rules"]);
    for f in &files {
        let name = f.file_name().expect("name");
        fs::copy(f, dir.path().join(name)).expect("copy");
        test.arg(name);
        let doc: Value = serde_yaml::from_str(&fs::read_to_string(f).expect("read")).expect("yaml");
        for t in doc["tests"].as_array().expect("tests") {
            for a in t["alert_rule_test"].as_array().into_iter().flatten() {
                let alert = a["alertname"].as_str().expect("alertname").to_string();
                if a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()) {
                    fires.insert(alert);
                } else {
                    silent.insert(alert);
                }
            }
        }
    }
    for a in c.alerts() {
        let name = a["alert"].as_str().expect("name");
        assert!(fires.contains(name), "no promtool test shows {name} firing");
        assert!(
            silent.contains(name),
            "no promtool test shows {name} silent"
        );
    }
    let (status, out) = run(test, dir.path(), "test");
    println!("{out}");
    assert!(status.success(), "promtool test rules:\n{out}");
}

/// One sample of the exposition: metric name, labels, value.
#[derive(Clone, Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The Prometheus text format's samples.
fn samples(body: &str) -> Vec<Sample> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (head, value) = line.rsplit_once(' ').expect("name value");
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("value in {line:?}"));
            let (name, labels) = match head.split_once('{') {
                None => (head.to_string(), BTreeMap::new()),
                Some((name, rest)) => {
                    let rest = rest.strip_suffix('}').expect("closing brace");
                    (name.to_string(), label_pairs(rest))
                }
            };
            Sample {
                name,
                labels,
                value,
            }
        })
        .collect()
}

fn label_pairs(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            return out;
        }
        assert_eq!(chars.next(), Some('"'), "quoted value in {text:?}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.push(match chars.next() {
                    Some('n') => '\n',
                    Some(x) => x,
                    None => break,
                }),
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

/// What Prometheus stores from one target of the ServiceMonitor: the samples with the target's
/// labels added where the sample has none of its own (honorLabels), and `up`.
fn as_scraped(samples: &[Sample]) -> Vec<Sample> {
    let target: BTreeMap<String, String> = [
        ("job", JOB),
        ("namespace", GUARD_NS),
        ("service", JOB),
        ("endpoint", "metrics"),
        ("pod", "quorumguard-0"),
        ("container", "quorumguard"),
        ("instance", "10.0.0.1:8080"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut out: Vec<Sample> = samples
        .iter()
        .map(|s| {
            let mut s = s.clone();
            for (k, v) in &target {
                s.labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
            s
        })
        .collect();
    out.push(Sample {
        name: "up".into(),
        labels: target,
        value: 1.0,
    });
    out
}

/// `serve` sweeping a real etcd cluster through the stand-in, publishing KCP status under a
/// Lease, after a denied review and a break-glass one: its `/metrics`.
async fn metrics_of_a_serve_that_probed_etcd() -> String {
    let etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    let members = seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});
    // A second control plane over the same etcd whose KCP claims two of its three members: its
    // rollout would stick (LeftoverMember), so the not-ready rollout series that the alert and
    // the dashboard's table read are served too.
    seed::cluster(
        &api,
        NS,
        STUCK,
        seed::direct_to(&etcd),
        &members[..2],
        Some(&etcd.pki),
        |_| {},
    );
    let dir = TempDir::new("monitoring");
    let pki = TestPki::new(dir.path());
    let identity = "quorumguard-0";
    let status = StatusConfig {
        publish: PublishConfig::default(),
        lease: Some(LeaseConfig {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(200),
            ..LeaseConfig::new(GUARD_NS, "quorumguard", identity)
        }),
    };
    let mut config = guard::serve_config(
        &pki,
        Duration::from_millis(400),
        Duration::from_millis(300),
        Some(status),
    );
    // The autopilot in dry-run: its series are served (at 0) and the alerts read them.
    config.autopilot = Some(AutopilotConfig {
        mode: Mode::DryRun,
        settings: Settings::default(),
        max_acting: 1,
        call_timeout: Duration::from_secs(10),
    });
    let client = kube::Client::try_from(api.kubeconfig_as(identity)).expect("client");
    let running: Running = server::start(config, client).await.expect("serve starts");

    // Wait on what serve did, not on its metrics (a renamed metric must fail the check below,
    // not this wait): the KCP shows EtcdQuorum Healthy once a sweep has probed etcd and the
    // Lease holder has published. Then two more cycles, so the cycle's figures are recorded.
    seed::wait_for(
        "EtcdQuorum Healthy published",
        Duration::from_secs(30),
        || {
            let kcp = api.get(&kcp_resource(), NS, seed::KCP).expect("kcp");
            kcp["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == CONDITION_ETCD_QUORUM && c["reason"] == "Healthy")
            })
        },
    )
    .await;
    seed::wait_for(
        "the second KCP's EtcdQuorum published",
        Duration::from_secs(30),
        || {
            let kcp = api
                .get(&kcp_resource(), NS, &format!("{STUCK}-controlplane"))
                .expect("kcp");
            kcp["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == CONDITION_ETCD_QUORUM))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A human deleting a healthy member's Machine: denied; with the break-glass annotation:
    // allowed as BreakGlass.
    let member = members[0].as_str();
    let human = "jane@example.com";
    let denied = guard::delete_review(member, human, false, "uid-denied");
    let (allowed, reason) = guard::verdict(&running, &pki, MACHINES, &denied).await;
    assert!(!allowed, "{reason}");
    let mut glass = guard::delete_review(member, human, false, "uid-glass");
    glass["request"]["oldObject"]["metadata"]["annotations"]["quorumguard.io/allow-unsafe-delete"] =
        json!("monitoring test");
    assert_eq!(
        guard::verdict(&running, &pki, MACHINES, &glass).await,
        (true, Reason::BreakGlass.as_str().to_string())
    );
    let (code, body) = try_get_plain(running.admin_addr, "/metrics")
        .await
        .expect("metrics");
    assert_eq!(code, 200);
    running.shutdown().await;
    drop(etcd);
    body
}

/// Every metric, label and label value the rules and the dashboard use, against a real serve's
/// `/metrics`; then every dashboard query and every selector evaluated by promtool on those
/// series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_used_is_served() {
    let promtool = promtool();
    let c = Component::load();
    let body = metrics_of_a_serve_that_probed_etcd().await;
    let series = as_scraped(&samples(&body));
    let names: BTreeSet<&str> = series.iter().map(|s| s.name.as_str()).collect();

    // (where, expression, labels its templates use)
    let mut uses: Vec<(String, String, Vec<String>)> = Vec::new();
    for a in c.alerts() {
        let name = a["alert"].as_str().expect("name");
        let mut labels = Vec::new();
        for v in a["annotations"].as_object().expect("annotations").values() {
            labels.extend(template_labels(v.as_str().expect("text"), "{{", "}}"));
        }
        labels.retain(|l| l != "value");
        uses.push((
            format!("alert {name}"),
            a["expr"].as_str().expect("expr").into(),
            labels,
        ));
    }
    let dashboard = c.dashboard();
    let queries = dashboard_queries(&dashboard);
    for q in &queries {
        uses.push((q.place.clone(), q.expr.clone(), q.legend_labels.clone()));
    }

    let mut problems = BTreeSet::new();
    let mut selectors = BTreeSet::new();
    for (place, expr, template) in &uses {
        let (sels, grouping) = promql::read(expr);
        if sels.is_empty() && !expr.starts_with("vector(") {
            problems.insert(format!("{place}: no metric read from {expr:?}"));
        }
        let mut available = BTreeSet::new();
        for s in &sels {
            let of_name: Vec<&Sample> = series.iter().filter(|x| x.name == s.name).collect();
            if !names.contains(s.name.as_str()) {
                problems.insert(format!("{place}: metric {} is not served", s.name));
                continue;
            }
            available.extend(of_name.iter().flat_map(|x| x.labels.keys().cloned()));
            for (label, op, value) in &s.matchers {
                let has_label = of_name.iter().any(|x| x.labels.contains_key(label));
                let has_value = of_name.iter().any(|x| x.labels.get(label) == Some(value));
                if !has_label || (op == "=" && !has_value) {
                    problems.insert(format!(
                        "{place}: no series {}{{{label}{op}{value:?}}}",
                        s.name
                    ));
                }
            }
            selectors.insert(s.text());
        }
        for label in grouping.iter().chain(template) {
            if !sels.is_empty() && !available.contains(label) {
                problems.insert(format!("{place}: label {label:?} is on none of its series"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "what the monitoring component uses that serve does not export:\n{}\n\n/metrics:\n{body}",
        problems.into_iter().collect::<Vec<_>>().join("\n")
    );

    // promtool, on the same series as Prometheus would store them for 20 minutes: each
    // dashboard query and each selector returns data.
    let input: Vec<Value> = series
        .iter()
        .map(|s| {
            let labels: Vec<String> = s
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={:?}", v))
                .collect();
            json!({"series": format!("{}{{{}}}", s.name, labels.join(", ")),
                   "values": format!("{}x40", s.value)})
        })
        .collect();
    let exprs = queries
        .iter()
        .filter(|q| !q.place.starts_with("variable"))
        .map(|q| q.expr.clone())
        .chain(selectors.iter().cloned());
    let tests: Vec<Value> = exprs
        .map(|e| {
            json!({"expr": format!("count({e}) > bool 0"), "eval_time": "15m",
                   "exp_samples": [{"labels": "{}", "value": 1}]})
        })
        .collect();
    let doc = json!({
        "rule_files": [],
        "evaluation_interval": "30s",
        "tests": [{"interval": "30s", "input_series": input, "promql_expr_test": tests}],
    });
    let dir = TempDir::new("promtool-series");
    fs::write(
        dir.path().join("served.test.yaml"),
        serde_yaml::to_string(&doc).expect("yaml"),
    )
    .expect("write");
    let mut cmd = Command::new(promtool);
    cmd.args(["test", "rules", "served.test.yaml"]);
    let (status, out) = run(cmd, dir.path(), "served");
    assert!(
        status.success(),
        "promtool found queries without data on a real serve's series:\n{out}"
    );
    println!(
        "{} queries and {} selectors return data on {} served series",
        queries.len(),
        selectors.len(),
        series.len()
    );
}
