//! What a review is answered with: allowed or not, one typed reason code, the message and the
//! warnings. The engine's judgements become outcomes as they are; the few answers the engine
//! does not give (no KubeadmControlPlane, a kind not judged, caches not synced) are built here,
//! each with its own message.

use std::fmt;

use quorumguard_engine::{ANNOTATION_BREAK_GLASS, Judgement, OnUnknownHealth, Policy, Reason};
use quorumguard_observe::state::{ClusterState, Kind};

use crate::review::{Decoded, ReviewResponse, respond};

/// The reason code of a webhook answer: the engine's [`Reason`], or one of the webhook's own
/// for what the engine does not judge. The string is API (`status.reason` of a denial, the
/// audit annotation `reason`, the `reason` label of `quorumguard_admission_requests_total`):
/// never rename one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReviewReason {
    /// The engine's answer; also [`Reason::HealthUnknown`] while the caches have not synced
    /// (nothing can be proven, and the unknown-health policy answers).
    Engine(Reason),
    /// The object belongs to no KubeadmControlPlane quorumguard knows: allowed, with a warning.
    NoControlPlane,
    /// A kind or operation the endpoint does not judge: allowed, with a warning.
    NotHandled,
    /// A body that is no AdmissionReview the webhook can read (HTTP 400 or 415): counted in the
    /// metrics; there is no review to answer.
    BadRequest,
}

impl ReviewReason {
    /// The webhook's own codes, beside the engine's [`Reason::ALL`].
    pub const OWN: [ReviewReason; 3] = [
        ReviewReason::NoControlPlane,
        ReviewReason::NotHandled,
        ReviewReason::BadRequest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReviewReason::Engine(r) => r.as_str(),
            ReviewReason::NoControlPlane => "NoControlPlane",
            ReviewReason::NotHandled => "NotHandled",
            ReviewReason::BadRequest => "BadRequest",
        }
    }
}

impl From<Reason> for ReviewReason {
    fn from(r: Reason) -> Self {
        ReviewReason::Engine(r)
    }
}

impl fmt::Display for ReviewReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one review, for the response, the log line and the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    pub reason: ReviewReason,
    /// The engine's message (a denial's ends with the next safe action), or the webhook's own.
    pub message: String,
    pub warnings: Vec<String>,
}

impl Outcome {
    /// The admission.k8s.io/v1 response to the review whose uid is `uid`.
    pub fn response<'a>(&'a self, uid: &'a str) -> ReviewResponse<'a> {
        respond(
            uid,
            self.allowed,
            self.reason.as_str(),
            &self.message,
            &self.warnings,
        )
    }

    /// The engine's judgement, answered as it is.
    pub(crate) fn judged(j: Judgement) -> Outcome {
        Outcome {
            allowed: j.allowed,
            reason: j.reason.into(),
            message: j.message,
            warnings: j.warnings,
        }
    }

    /// An answer the engine did not give: an allow says its message as a warning too.
    fn unjudged(allowed: bool, reason: ReviewReason, message: String) -> Outcome {
        let warnings = if allowed {
            vec![message.clone()]
        } else {
            Vec::new()
        };
        Outcome {
            allowed,
            reason,
            message,
            warnings,
        }
    }

    /// A kind or operation (`what`) the endpoint does not judge.
    pub(crate) fn not_handled(what: &str) -> Outcome {
        Outcome::unjudged(
            true,
            ReviewReason::NotHandled,
            format!("quorumguard does not judge {what}; allowed"),
        )
    }

    /// No KubeadmControlPlane guards the object of `d`.
    pub(crate) fn unguarded(d: &Decoded) -> Outcome {
        Outcome::unjudged(
            true,
            ReviewReason::NoControlPlane,
            format!(
                "{} {}/{} belongs to no KubeadmControlPlane quorumguard knows; not guarded",
                d.kind, d.namespace, d.name
            ),
        )
    }

    /// The caches are not synced: nothing can be proven. The same policy as unknown health.
    pub(crate) fn not_synced(d: &Decoded, policy: &Policy, state: &ClusterState) -> Outcome {
        let unsynced = Kind::ALL
            .iter()
            .filter(|k| !state.is_synced(**k))
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        Outcome::unjudged(
            policy.on_unknown_health(&d.requester) == OnUnknownHealth::Allow,
            Reason::HealthUnknown.into(),
            format!(
                "quorumguard's caches have not synced yet ({unsynced}): it cannot prove that {} of {}/{} is safe. Retry in a few seconds; in an emergency set the annotation {ANNOTATION_BREAK_GLASS}=<reason> on the Machine, or delete the ValidatingWebhookConfiguration quorumguard.",
                d.operation, d.namespace, d.name
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhooks_own_codes_keep_their_strings_and_are_no_engine_reason() {
        let own: Vec<&str> = ReviewReason::OWN.iter().map(|r| r.as_str()).collect();
        assert_eq!(own, ["NoControlPlane", "NotHandled", "BadRequest"]);
        for r in ReviewReason::OWN {
            assert_eq!(format!("{r:?}"), r.as_str());
            assert!(Reason::ALL.iter().all(|e| e.as_str() != r.as_str()), "{r}");
        }
        for r in Reason::ALL {
            assert_eq!(ReviewReason::from(r).to_string(), r.as_str());
        }
    }
}
