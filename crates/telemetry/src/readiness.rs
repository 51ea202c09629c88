//! Readiness ([`Readiness`]): whether this replica should receive admission reviews, and why
//! not.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this replica should receive admission reviews. kube-apiserver reaches the webhook
/// through a Service, so an unready replica is simply skipped: say "not ready" until the
/// certificate is loaded, the caches are synced (a review answered from empty caches would be
/// guessed) and the first etcd sweep has probed every workload cluster known then (a review
/// answered before would know no member's health: during a rollout of the guard itself the old
/// replica keeps answering until the new one has looked), and from the moment shutdown starts
/// (so the endpoint is removed before the listener closes). Each flag is an atomic: set them
/// from any task, no lock.
#[derive(Debug, Default)]
pub struct Readiness {
    cert_loaded: AtomicBool,
    caches_synced: AtomicBool,
    swept: AtomicBool,
    accepting: AtomicBool,
    shutting_down: AtomicBool,
}

impl Readiness {
    /// All flags false: not ready until the server says otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// The serving certificate has been loaded (a later failed reload keeps the old one served,
    /// so it does not clear this).
    pub fn set_cert_loaded(&self, loaded: bool) {
        self.cert_loaded.store(loaded, Ordering::SeqCst);
    }

    /// Every watch cache the decisions read from has synced.
    pub fn set_caches_synced(&self, synced: bool) {
        self.caches_synced.store(synced, Ordering::SeqCst);
    }

    /// The first etcd sweep after the caches synced is done (or readiness stopped waiting for
    /// it, or etcd is not probed at all).
    pub fn set_swept(&self, swept: bool) {
        self.swept.store(swept, Ordering::SeqCst);
    }

    /// The HTTPS listener is bound and serving.
    pub fn set_accepting(&self, accepting: bool) {
        self.accepting.store(accepting, Ordering::SeqCst);
    }

    /// Graceful shutdown has begun: stop getting new reviews while in-flight ones finish.
    pub fn set_shutting_down(&self, shutting_down: bool) {
        self.shutting_down.store(shutting_down, Ordering::SeqCst);
    }

    /// Ready: certificate loaded, caches synced, first sweep done, accepting, and not shutting
    /// down.
    pub fn is_ready(&self) -> bool {
        self.not_ready_reasons().is_empty()
    }

    /// Why the replica is not ready, one short phrase per unmet condition (empty when ready);
    /// `/readyz` lists them so `kubectl describe pod` shows the cause.
    pub fn not_ready_reasons(&self) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        if !self.cert_loaded.load(Ordering::SeqCst) {
            reasons.push("serving certificate not loaded");
        }
        if !self.caches_synced.load(Ordering::SeqCst) {
            reasons.push("watch caches not synced");
        }
        if !self.swept.load(Ordering::SeqCst) {
            reasons.push("first etcd sweep not finished: workload clusters known at start not all probed yet");
        }
        if !self.accepting.load(Ordering::SeqCst) {
            reasons.push("not accepting admission requests");
        }
        if self.shutting_down.load(Ordering::SeqCst) {
            reasons.push("shutting down");
        }
        reasons
    }
}
