//! Tests of the engine: hand-worked tables per rule, the named cases, and the exhaustive search.

mod admit;
mod capi;
mod cases;
mod exhaustive;
mod mhc;
mod next;
mod oracle;
mod replicas;
mod rules;
mod words;

use crate::testkit::*;
use crate::*;

/// A verdict is `allowed` for `reason`, and a denial says what to do next.
fn assert_verdict(v: &Verdict, allowed: bool, reason: Reason) {
    assert_eq!(
        (v.allowed, v.reason),
        (allowed, reason),
        "verdict was {v:#?}"
    );
    if !allowed {
        assert!(
            v.message.contains("Next safe action:"),
            "a denial must say what to do next: {}",
            v.message
        );
    }
}

fn three_healthy() -> ControlPlane {
    cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())])
}
