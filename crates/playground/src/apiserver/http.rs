//! Routing and the REST verbs: discovery, get, list, watch, create, update, patch, delete.

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::resources::{self, AGGREGATED_CONTENT_TYPE, ResourceDef};
use super::rules::{self, meta_str};
use super::select::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{self, Filter, Key};
use super::writes::{apply_patch, create, delete, delete_collection, write};
use super::{AdmissionAttempt, Operation, Shared, lock, portforward, watch};

/// Request bodies above this size are refused, as kube-apiserver does (3 MiB objects, plus slack).
const BODY_LIMIT: usize = 8 << 20;
/// A write re-reads and retries this often when the object changed under it.
pub const WRITE_ATTEMPTS: usize = 5;

/// The query parameters of a request.
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    /// Every value of a repeatable parameter (`dryRun=All&dryRun=...`), in order.
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// A resource path: `res` indexes `Store::defs`.
#[derive(Clone, Debug)]
pub struct Target {
    pub res: usize,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

enum Route {
    Version,
    CoreVersions,
    Groups,
    Group(String),
    Resources(String, String),
    Resource(Target),
    Unknown,
}

fn route(defs: &[ResourceDef], path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["apis", g] => return Route::Group((*g).to_string()),
        ["api", v] => return Route::Resources(String::new(), (*v).to_string()),
        ["apis", g, v] => return Route::Resources((*g).to_string(), (*v).to_string()),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::Unknown,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some((*n).to_string()), None),
        [p, n, s] => (*p, Some((*n).to_string()), Some((*s).to_string())),
        _ => return Route::Unknown,
    };
    let Some(res) = defs
        .iter()
        .position(|d| d.group == group && d.version == version && d.plural == plural)
    else {
        return Route::Unknown;
    };
    let Some(namespaced) = defs.get(res).map(|d| d.namespaced) else {
        return Route::Unknown;
    };
    if (namespaced && namespace.is_none() && name.is_some()) || (!namespaced && namespace.is_some())
    {
        return Route::Unknown;
    }
    Route::Resource(Target {
        res,
        namespace,
        name,
        sub,
    })
}

/// The Kubernetes verb of a request, as audit logs and RBAC name it.
fn verb(method: &Method, route: &Route, params: &Params) -> &'static str {
    let named = matches!(route, Route::Resource(Target { name: Some(_), .. }));
    match *method {
        Method::GET if !matches!(route, Route::Resource(_)) => "get",
        Method::GET if named => "get",
        Method::GET if params.flag("watch") => "watch",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

fn json_response(code: StatusCode, body: &Value, content_type: &str) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = code;
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    response
}

pub fn ok(code: u16, body: &Value) -> Response {
    json_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::OK),
        body,
        "application/json",
    )
}

fn error_response(err: &ApiError) -> Response {
    json_response(
        StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &err.body,
        "application/json",
    )
}

/// Everything a handler needs from one request.
pub struct Call {
    pub shared: Arc<Shared>,
    pub method: Method,
    pub headers: HeaderMap,
    pub params: Params,
    pub body: Bytes,
    pub def: ResourceDef,
    pub target: Target,
    /// Admission warnings for the response, each text once, in order.
    pub warnings: Mutex<Vec<String>>,
}

impl Call {
    pub fn key(&self) -> Key {
        let name = self.target.name.clone().unwrap_or_default();
        (
            self.target.res,
            self.target.namespace.clone().unwrap_or_default(),
            name,
        )
    }

    pub fn name(&self) -> &str {
        self.target.name.as_deref().unwrap_or("")
    }

    /// The client asked for PartialObjectMetadata (`get_metadata`, `list_metadata`, ...).
    pub fn partial(&self) -> bool {
        let accept = self
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        accept.contains("as=PartialObjectMetadata")
    }

    /// An object as the client asked to see it.
    pub fn shown(&self, object: &Value) -> Value {
        if self.partial() {
            store::partial(object)
        } else {
            object.clone()
        }
    }

    pub fn dry_run(&self) -> bool {
        self.params.get("dryRun") == Some("All")
    }

    pub fn body_json(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding the request body: {e}")))
    }

    pub fn filter(&self) -> Result<Filter, ApiError> {
        let labels = LabelSelector::parse(self.params.get("labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(self.params.get("fieldSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        Ok(Filter {
            res: self.target.res,
            namespace: self.target.namespace.clone(),
            labels,
            fields,
        })
    }

    /// Runs admission; keeps its warnings for the response whatever the outcome.
    pub async fn admit(&self, attempt: AdmissionAttempt) -> Result<(), ApiError> {
        let (warnings, result) = self.shared.admit(attempt).await;
        let mut kept = lock(&self.warnings);
        for w in warnings {
            if !w.is_empty() && !kept.contains(&w) {
                kept.push(w);
            }
        }
        result
    }

    /// CreateOptions or UpdateOptions from the query, as kube-apiserver passes them to
    /// admission (a PATCH's PatchOptions become UpdateOptions without `force`).
    fn write_options(&self, kind: &str) -> Value {
        let mut options = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
        let dry_run = self.params.all("dryRun");
        if !dry_run.is_empty() {
            options["dryRun"] = json!(dry_run);
        }
        for key in ["fieldManager", "fieldValidation"] {
            if let Some(v) = self.params.get(key).filter(|v| !v.is_empty()) {
                options[key] = json!(v);
            }
        }
        options
    }

    pub fn attempt(
        &self,
        operation: Operation,
        object: Option<Value>,
        old_object: Option<Value>,
    ) -> AdmissionAttempt {
        let user = self
            .headers
            .get("impersonate-user")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("system:anonymous");
        let is_scale = self.target.sub.as_deref() == Some("scale");
        AdmissionAttempt {
            operation,
            group: self.def.group.clone(),
            version: self.def.version.clone(),
            resource: self.def.plural.clone(),
            kind: if is_scale {
                "Scale".into()
            } else {
                self.def.kind.clone()
            },
            sub_resource: self.target.sub.clone(),
            namespace: self.target.namespace.clone(),
            name: self.name().to_string(),
            object,
            old_object,
            user: user.to_string(),
            dry_run: self.dry_run(),
            options: match operation {
                Operation::Create => Some(self.write_options("CreateOptions")),
                Operation::Update => Some(self.write_options("UpdateOptions")),
                // The DELETE handler sets them from its body.
                Operation::Delete => None,
            },
        }
    }
}

/// The single entry point: every request of every path comes here.
pub async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    // Port-forward upgrades the connection: it needs the request whole.
    if let Some((namespace, pod)) = portforward::target(request.uri().path()) {
        return portforward::handle(shared, request, namespace, pod).await;
    }
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_string();
    let params = Params(
        Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map(|q| q.0)
            .unwrap_or_default(),
    );
    let (route, defs) = {
        let store = shared.store();
        (route(&store.defs, &path), store.defs.clone())
    };
    let verb = verb(&parts.method, &route, &params);
    let user = parts
        .headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("system:anonymous");
    shared.record_as(verb, &path, parts.uri.query().unwrap_or(""), user);
    let (delay, fail) = shared.take_faults(verb, &path);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(code) = fail {
        let target = match &route {
            Route::Resource(t) => t.name.as_deref().zip(defs.get(t.res)).map(|(n, d)| (d, n)),
            _ => None,
        };
        return error_response(&ApiError::injected(code, target));
    }
    let body = match to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            return error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                "the request body is too large",
                None,
            ));
        }
    };
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let aggregated = accept.contains("as=APIGroupDiscoveryList");
    let discovery = |found: Option<Value>| match found {
        _ if parts.method != Method::GET => error_response(&ApiError::method_not_allowed()),
        Some(v) => ok(200, &v),
        None => error_response(&ApiError::no_such_resource()),
    };
    let target = match route {
        Route::Version => return discovery(Some(version_info())),
        Route::CoreVersions if aggregated && parts.method == Method::GET => {
            return json_response(
                StatusCode::OK,
                &resources::aggregated(&defs, true),
                AGGREGATED_CONTENT_TYPE,
            );
        }
        Route::Groups if aggregated && parts.method == Method::GET => {
            return json_response(
                StatusCode::OK,
                &resources::aggregated(&defs, false),
                AGGREGATED_CONTENT_TYPE,
            );
        }
        Route::CoreVersions => {
            return discovery(Some(resources::core_versions(&shared.addr.to_string())));
        }
        Route::Groups => return discovery(Some(resources::group_list(&defs))),
        Route::Group(g) => return discovery(resources::group(&defs, &g)),
        Route::Resources(g, v) => return discovery(resources::resource_list(&defs, &g, &v)),
        Route::Unknown => return error_response(&ApiError::no_such_resource()),
        Route::Resource(t) => t,
    };
    let Some(def) = defs.get(target.res).cloned() else {
        return error_response(&ApiError::no_such_resource());
    };
    let call = Call {
        shared,
        method: parts.method,
        headers: parts.headers,
        params,
        body,
        def,
        target,
        warnings: Mutex::new(Vec::new()),
    };
    let mut response = match dispatch(&call).await {
        Ok(response) => response,
        Err(err) => error_response(&err),
    };
    for text in lock(&call.warnings).iter() {
        if let Some(v) = warning_header(text) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

/// `299 - "<text>"` with `"` and `\` escaped, as kube-apiserver writes a warning (k8s.io/
/// apimachinery `NewWarningHeader`). Control characters, which no header may hold, become
/// spaces.
fn warning_header(text: &str) -> Option<HeaderValue> {
    let mut value = String::with_capacity(text.len() + 8);
    value.push_str("299 - \"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                value.push('\\');
                value.push(c);
            }
            c if c.is_control() => value.push(' '),
            c => value.push(c),
        }
    }
    value.push('"');
    HeaderValue::from_bytes(value.as_bytes()).ok()
}

fn version_info() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-quorumguard-standin",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "none", "compiler": "none", "platform": "linux/amd64",
    })
}

async fn dispatch(call: &Call) -> Result<Response, ApiError> {
    let t = &call.target;
    let sub = t.sub.as_deref();
    let sub_ok = match sub {
        None => true,
        Some("status") => call.def.status_subresource,
        Some("scale") => call.def.scale.is_some(),
        Some(_) => false,
    };
    if !sub_ok {
        return Err(ApiError::no_such_resource());
    }
    match (&call.method, t.name.is_some()) {
        (&Method::GET, true) => get(call),
        (&Method::GET, false) if call.params.flag("watch") => watch::start(
            &call.shared,
            t,
            call.filter()?,
            &call.params,
            call.partial(),
        ),
        (&Method::GET, false) => list(call),
        (&Method::POST, false) if t.namespace.is_some() || !call.def.namespaced => {
            create(call).await
        }
        (&Method::PUT, true) => {
            let body = call.body_json()?;
            write(call, move |_| Ok(body.clone())).await
        }
        (&Method::PATCH, true) => write(call, |current| apply_patch(call, current)).await,
        (&Method::DELETE, true) if sub.is_none() => delete(call, call.name())
            .await
            .map(|(code, body)| ok(code, &body)),
        (&Method::DELETE, false) => delete_collection(call).await,
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn get(call: &Call) -> Result<Response, ApiError> {
    let store = call.shared.store();
    let object = store
        .get(&call.key())
        .ok_or_else(|| ApiError::not_found(&call.def, call.name()))?;
    let body = if call.target.sub.as_deref() == Some("scale") {
        rules::scale_view(&call.def, object)
    } else {
        call.shown(object)
    };
    Ok(ok(200, &body))
}

fn list(call: &Call) -> Result<Response, ApiError> {
    let filter = call.filter()?;
    let limit: usize = call
        .params
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let store = call.shared.store();
    let rv = call.params.get("resourceVersion").unwrap_or("");
    if !rv.is_empty() && rv != "0" {
        let n: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?;
        if n > store.rv {
            return Err(ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {n}, current: {}", store.rv),
                None,
            ));
        }
        if call.params.get("resourceVersionMatch") == Some("Exact") && n != store.rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {n} ({})",
                store.rv
            )));
        }
    }
    let (list_rv, after) = match call.params.get("continue").filter(|c| !c.is_empty()) {
        None => (store.rv, None),
        Some(token) => {
            let bad = || ApiError::bad_request(format!("continue key is not valid: {token}"));
            let mut parts = token.splitn(3, '|');
            let (Some(rv), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(bad());
            };
            let rv: u64 = rv.parse().map_err(|_| bad())?;
            if store.changed_since(call.target.res, rv) {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some((ns.to_string(), name.to_string())))
        }
    };
    let mut items = store.list(
        &filter,
        after.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
    );
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if limit > 0 && items.len() > limit {
        let remaining = items.len() - limit;
        items.truncate(limit);
        if let Some(last) = items.last() {
            let ns = meta_str(last, "namespace").unwrap_or("");
            let name = meta_str(last, "name").unwrap_or("");
            metadata["continue"] = json!(format!("{list_rv}|{ns}|{name}"));
        }
        if call.params.get("labelSelector").unwrap_or("").is_empty()
            && call.params.get("fieldSelector").unwrap_or("").is_empty()
        {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    if call.partial() {
        let items: Vec<Value> = items.iter().map(store::partial).collect();
        let body = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "items": items});
        return Ok(ok(200, &body));
    }
    if !call.def.custom {
        // Built-in lists carry the type only at the top, not on each item.
        for item in &mut items {
            if let Some(map) = item.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
        }
    }
    let body = json!({"kind": format!("{}List", call.def.kind), "apiVersion": call.def.api_version(), "metadata": metadata, "items": items});
    Ok(ok(200, &body))
}
