//! The failures, delays and latency a test injects: per verb and path, for a number of
//! requests or until cleared.

use std::time::Duration;

use super::{ApiServer, Shared, lock};

#[derive(Clone, Debug)]
enum FaultAction {
    Fail(u16),
    Delay(Duration),
}

#[derive(Clone, Debug)]
pub(super) struct Fault {
    verb: Option<String>,
    path: String,
    remaining: usize,
    action: FaultAction,
}

impl Fault {
    fn matches(&self, verb: &str, path: &str) -> bool {
        let path_ok = match self.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => self.path == path,
        };
        path_ok && self.verb.as_deref().is_none_or(|v| v == verb)
    }
}

impl Shared {
    /// The delay to add to this request and the failure code to answer, if any; uses up one
    /// count of every matching fault.
    pub(super) fn take_faults(&self, verb: &str, path: &str) -> (Duration, Option<u16>) {
        let mut delay = *lock(&self.latency);
        let mut fail = None;
        let mut faults = lock(&self.faults);
        for fault in faults
            .iter_mut()
            .filter(|f| f.remaining > 0 && f.matches(verb, path))
        {
            match fault.action {
                FaultAction::Delay(d) => delay += d,
                FaultAction::Fail(_) if fail.is_some() => continue,
                FaultAction::Fail(code) => fail = Some(code),
            }
            fault.remaining -= 1;
        }
        faults.retain(|f| f.remaining > 0);
        (delay, fail)
    }
}

impl ApiServer {
    /// The next `times` requests with this verb (any when `None`) and path answer `code` with
    /// a Status shaped like the real failure. A path ending in `*` is a prefix.
    pub fn fail_next(&self, verb: Option<&str>, path: &str, times: usize, code: u16) {
        self.add_fault(verb, path, times, FaultAction::Fail(code));
    }

    /// The next `times` matching requests wait `delay` before being handled.
    pub fn delay_next(&self, verb: Option<&str>, path: &str, times: usize, delay: Duration) {
        self.add_fault(verb, path, times, FaultAction::Delay(delay));
    }

    fn add_fault(&self, verb: Option<&str>, path: &str, remaining: usize, action: FaultAction) {
        let fault = Fault {
            verb: verb.map(str::to_string),
            path: path.to_string(),
            remaining,
            action,
        };
        lock(&self.shared.faults).push(fault);
    }

    /// Ends every fault added with [`Self::fail_next`] or [`Self::delay_next`] that has not run
    /// out: a test's outage ends when it says so, not when a count is used up.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Latency added to every request from now on.
    pub fn set_latency(&self, latency: Duration) {
        *lock(&self.shared.latency) = latency;
    }
}
