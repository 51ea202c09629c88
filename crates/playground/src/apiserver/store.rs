//! The object store: objects, the global resourceVersion counter, the change history that
//! watches replay, and the open watch subscriptions.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

use super::resources::ResourceDef;
use super::rules::{finalizers, meta_str, now, set_meta};
use super::select::{FieldSelector, LabelSelector};
use super::status::ApiError;

/// (resource index, namespace or "" when cluster-scoped, name): sorts like etcd keys.
pub type Key = (usize, String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change, as the watch cache keeps it.
#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    pub res: usize,
    pub kind: ChangeKind,
    pub object: Value,
    pub prev: Option<Value>,
}

/// Which objects a list or watch selects.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub res: usize,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn matches(&self, object: &Value) -> bool {
        let ns_ok = self
            .namespace
            .as_deref()
            .is_none_or(|ns| meta_str(object, "namespace") == Some(ns));
        ns_ok && self.labels.matches(object) && self.fields.matches(object)
    }

    /// The event a watcher with this filter sees for `change`, following the watch cache:
    /// an object that starts matching is ADDED, one that stops matching is DELETED.
    pub fn event_for(&self, change: &Change) -> Option<Value> {
        if change.res != self.res {
            return None;
        }
        let now = change.kind != ChangeKind::Deleted && self.matches(&change.object);
        let before = change.prev.as_ref().is_some_and(|p| self.matches(p));
        match (now, before) {
            (true, false) => Some(event("ADDED", &change.object)),
            (true, true) => Some(event("MODIFIED", &change.object)),
            (false, true) => {
                let mut gone = change.prev.clone().unwrap_or(Value::Null);
                set_meta(&mut gone, "resourceVersion", json!(change.rv.to_string()));
                Some(event("DELETED", &gone))
            }
            (false, false) => None,
        }
    }
}

/// The `meta.k8s.io/v1` PartialObjectMetadata form of an object (metadata-only requests).
pub fn partial(object: &Value) -> Value {
    let metadata = object.get("metadata").cloned().unwrap_or_else(|| json!({}));
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata})
}

pub fn event(kind: &str, object: &Value) -> Value {
    json!({"type": kind, "object": object})
}

/// A BOOKMARK event at `rv`, optionally marking the end of the initial events.
pub fn bookmark(def: &ResourceDef, rv: u64, initial_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event(
        "BOOKMARK",
        &json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": metadata}),
    )
}

/// Where a new watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// `resourceVersion` "" or "0": synthetic ADDED events for the current objects first.
    Current,
    /// `sendInitialEvents=true`: like `Current`, then a bookmark marking the end.
    InitialEvents,
    /// Every change after this resourceVersion.
    After(u64),
}

struct Subscriber {
    filter: Filter,
    tx: UnboundedSender<Value>,
}

/// The first resourceVersion; nothing before it can be watched.
const FIRST_RV: u64 = 100;

pub struct Store {
    pub defs: Vec<ResourceDef>,
    pub rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    pub history_limit: usize,
    /// The history holds every change with a resourceVersion above this one.
    pub compacted_rv: u64,
    subscribers: Vec<Subscriber>,
    serial: u64,
}

impl Store {
    pub fn new(defs: Vec<ResourceDef>) -> Self {
        Self {
            defs,
            rv: FIRST_RV,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: 10_000,
            compacted_rv: FIRST_RV,
            subscribers: Vec::new(),
            serial: 0,
        }
    }

    pub fn def_index(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.defs
            .iter()
            .position(|d| d.group == group && d.version == version && d.plural == plural)
    }

    pub fn def_by_type(&self, api_version: &str, kind: &str) -> Option<usize> {
        self.defs
            .iter()
            .position(|d| d.api_version() == api_version && d.kind == kind)
    }

    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Current objects of `filter.res` that match, in key order, starting after `after`.
    pub fn list(&self, filter: &Filter, after: Option<(&str, &str)>) -> Vec<Value> {
        let from = (filter.res, String::new(), String::new());
        let to = (filter.res + 1, String::new(), String::new());
        self.objects
            .range(from..to)
            .filter(|((_, ns, name), _)| {
                after.is_none_or(|(ans, aname)| (ns.as_str(), name.as_str()) > (ans, aname))
            })
            .map(|(_, o)| o)
            .filter(|o| filter.matches(o))
            .cloned()
            .collect()
    }

    /// True when resource `res` changed after `rv`, or the history no longer reaches back there.
    pub fn changed_since(&self, res: usize, rv: u64) -> bool {
        rv < self.compacted_rv || self.history.iter().any(|c| c.res == res && c.rv > rv)
    }

    pub fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    /// Forgets the change history: watches from an older resourceVersion get 410 Expired.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
    }

    fn record(&mut self, change: Change) {
        self.subscribers
            .retain(|s| match s.filter.event_for(&change) {
                Some(ev) => s.tx.send(ev).is_ok(),
                None => !s.tx.is_closed(),
            });
        self.history.push_back(change);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
    }

    /// Stores a new object (already prepared) under a fresh resourceVersion.
    pub fn commit_create(&mut self, key: Key, mut object: Value) -> Value {
        self.rv += 1;
        set_meta(&mut object, "resourceVersion", json!(self.rv.to_string()));
        self.objects.insert(key.clone(), object.clone());
        self.record(Change {
            rv: self.rv,
            res: key.0,
            kind: ChangeKind::Added,
            object: object.clone(),
            prev: None,
        });
        object
    }

    /// Replaces an object. A no-op write changes nothing (no new resourceVersion, no event);
    /// an object that has a deletionTimestamp and no finalizers left is deleted.
    pub fn commit_update(&mut self, key: &Key, mut object: Value) -> Value {
        let Some(old) = self.objects.get(key).cloned() else {
            return object;
        };
        set_meta(
            &mut object,
            "resourceVersion",
            old["metadata"]["resourceVersion"].clone(),
        );
        if object == old {
            return old;
        }
        self.rv += 1;
        set_meta(&mut object, "resourceVersion", json!(self.rv.to_string()));
        let finished =
            meta_str(&object, "deletionTimestamp").is_some() && finalizers(&object).is_empty();
        let kind = if finished {
            self.objects.remove(key);
            ChangeKind::Deleted
        } else {
            self.objects.insert(key.clone(), object.clone());
            ChangeKind::Modified
        };
        self.record(Change {
            rv: self.rv,
            res: key.0,
            kind,
            object: object.clone(),
            prev: Some(old),
        });
        object
    }

    /// Removes an object at once; returns it with the deletion's resourceVersion.
    pub fn commit_delete(&mut self, key: &Key) -> Option<Value> {
        let old = self.objects.remove(key)?;
        self.rv += 1;
        let mut gone = old.clone();
        set_meta(&mut gone, "resourceVersion", json!(self.rv.to_string()));
        self.record(Change {
            rv: self.rv,
            res: key.0,
            kind: ChangeKind::Deleted,
            object: gone.clone(),
            prev: Some(old),
        });
        Some(gone)
    }

    /// Registers a watch and queues the events it starts with. An `Err` is the `Status` to
    /// send as an ERROR event (410 Expired for a too old resourceVersion).
    pub fn subscribe(
        &mut self,
        filter: Filter,
        tx: UnboundedSender<Value>,
        start: WatchStart,
    ) -> Result<(), Value> {
        match start {
            WatchStart::Current | WatchStart::InitialEvents => {
                for object in self.list(&filter, None) {
                    let _ = tx.send(event("ADDED", &object));
                }
                if start == WatchStart::InitialEvents
                    && let Some(def) = self.defs.get(filter.res)
                {
                    let _ = tx.send(bookmark(def, self.rv, true));
                }
            }
            WatchStart::After(rv) if rv < self.compacted_rv => {
                let msg = format!("too old resource version: {rv} ({})", self.compacted_rv);
                return Err(ApiError::expired(msg).body);
            }
            WatchStart::After(rv) if rv > self.rv => {
                let msg = format!("Too large resource version: {rv}, current: {}", self.rv);
                let details = json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1});
                return Err(ApiError::new(504, "Timeout", msg, Some(details)).body);
            }
            WatchStart::After(rv) => {
                for change in self.history.iter().filter(|c| c.rv > rv) {
                    if let Some(ev) = filter.event_for(change) {
                        let _ = tx.send(ev);
                    }
                }
            }
        }
        self.subscribers.push(Subscriber { filter, tx });
        Ok(())
    }

    /// Sets an object straight into the store ([`super::ApiServer::insert`]): no admission, no subresource rules.
    pub fn put_direct(&mut self, key: Key, mut object: Value) -> Value {
        if let Some(old) = self.objects.get(&key) {
            for field in ["uid", "creationTimestamp"] {
                if meta_str(&object, field).is_none() {
                    let value = old.pointer(&format!("/metadata/{field}")).cloned();
                    set_meta(&mut object, field, value.unwrap_or(Value::Null));
                }
            }
        }
        if meta_str(&object, "uid").is_none() {
            let uid = self.new_uid();
            set_meta(&mut object, "uid", json!(uid));
        }
        if meta_str(&object, "creationTimestamp").is_none() {
            set_meta(&mut object, "creationTimestamp", json!(now()));
        }
        if self.defs.get(key.0).is_some_and(|d| d.custom)
            && object.pointer("/metadata/generation").is_none()
        {
            set_meta(&mut object, "generation", json!(1));
        }
        if self.objects.contains_key(&key) {
            self.commit_update(&key, object)
        } else {
            self.commit_create(key, object)
        }
    }

    pub fn new_uid(&mut self) -> String {
        let n = self.next_serial();
        format!("5a0d0000-0000-4000-8000-{n:012x}")
    }
}
