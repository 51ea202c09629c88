//! Membership through `etcdctl`: the member list, and the changes (remove, add a member or a
//! learner, promote), each asked of a live member and retried while etcd refuses it for now.

use std::thread::sleep;
use std::time::{Duration, Instant};

use super::{EXIT_WAIT, EtcdCluster, EtcdError, RECONFIG_WAIT};

/// One member of [`EtcdCluster::member_list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedMember {
    pub id: u64,
    /// Empty for a member added but not started yet.
    pub name: String,
    pub learner: bool,
}

impl EtcdCluster {
    /// The endpoints of running, unfrozen members (for admin commands).
    fn live_endpoints(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for node in &mut self.nodes {
            let running = node
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
            if running && !node.frozen {
                out.push(node.client_url());
            }
        }
        out
    }

    /// `etcdctl member list -w json`, asked of each running, unfrozen member until one answers.
    pub fn member_list(&mut self) -> Result<Vec<ListedMember>, EtcdError> {
        let what = "member list";
        let mut last = String::from("no member is running");
        for ep in self.live_endpoints() {
            match self.etcdctl(std::slice::from_ref(&ep), &["member", "list", "-w", "json"]) {
                Ok(out) => return parse_member_list(&out),
                Err(e) => last = e.to_string(),
            }
        }
        Err(EtcdError::NoAnswer { what, last })
    }

    /// Member `i`'s ID, from the member list.
    pub fn member_id(&mut self, i: usize) -> Result<u64, EtcdError> {
        let name = self.node(i)?.name.clone();
        self.member_list()?
            .into_iter()
            .find(|m| m.name == name)
            .map(|m| m.id)
            .ok_or(EtcdError::NoSuchMember(name))
    }

    /// A membership change through a live member other than `not_via` (a member being removed
    /// stops as the removal applies, and may not answer it: "etcdserver: server stopped"),
    /// retried while etcd answers "unhealthy cluster" (its peers must have been connected for
    /// 5 s).
    fn member_change(
        &mut self,
        args: &[&str],
        not_via: Option<usize>,
    ) -> Result<String, EtcdError> {
        let started = Instant::now();
        let avoid = not_via.and_then(|i| self.client_url(i));
        loop {
            let live = self.live_endpoints();
            let others: Vec<String> = live
                .iter()
                .filter(|e| Some(*e) != avoid.as_ref())
                .cloned()
                .collect();
            let eps = if others.is_empty() { live } else { others };
            let Some(first) = eps.first() else {
                return Err(EtcdError::NoAnswer {
                    what: "a membership change",
                    last: "no member is running".into(),
                });
            };
            match self.etcdctl(std::slice::from_ref(first), args) {
                Ok(out) => return Ok(out),
                Err(e)
                    if e.to_string().contains("unhealthy cluster")
                        && started.elapsed() < RECONFIG_WAIT =>
                {
                    sleep(Duration::from_millis(300));
                }
                Err(e) => {
                    return Err(EtcdError::MemberChange {
                        error: e.to_string(),
                        tail: self.logs(),
                    });
                }
            }
        }
    }

    /// Removes member `i` with `etcdctl member remove`, then waits (at most [`EXIT_WAIT`]) for
    /// its process to exit by itself, as a removed etcd member does. Returns whether it did;
    /// if not, kills it.
    pub fn remove_member(&mut self, i: usize) -> Result<bool, EtcdError> {
        let id = format!("{:x}", self.member_id(i)?);
        self.member_change(&["member", "remove", &id], Some(i))?;
        let started = Instant::now();
        let mut exited = false;
        while started.elapsed() < EXIT_WAIT {
            if !self.is_running(i) {
                exited = true;
                break;
            }
            sleep(Duration::from_millis(100));
        }
        self.kill(i);
        Ok(exited)
    }

    /// Adds a learner named `name` with `etcdctl member add --learner` and returns its index.
    /// It is not started: it has no name and no client URLs in the member list until
    /// [`EtcdCluster::start_member`].
    pub fn add_learner(&mut self, name: &str) -> Result<usize, EtcdError> {
        self.add(name, true)
    }

    /// Adds a voting member named `name` (`etcdctl member add`, as kubeadm did before learner
    /// mode) and returns its index. From this moment it counts towards the quorum while it has
    /// not started: [`EtcdCluster::start_member`] it soon.
    pub fn add_member(&mut self, name: &str) -> Result<usize, EtcdError> {
        self.add(name, false)
    }

    fn add(&mut self, name: &str, learner: bool) -> Result<usize, EtcdError> {
        let mut node = self.new_node(name)?;
        let peer = format!("--peer-urls={}", node.peer_url());
        let mut args = vec!["member", "add", name, &peer];
        if learner {
            args.push("--learner");
        }
        let out = self.member_change(&args, None)?;
        // etcdctl prints the --initial-cluster the new member must start with.
        node.initial_cluster = out
            .lines()
            .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER="))
            .map(|v| v.trim_matches('"').to_string())
            .ok_or_else(|| EtcdError::Output {
                what: "member add",
                why: format!("no ETCD_INITIAL_CLUSTER in: {out}"),
            })?;
        node.initial_state = "existing";
        self.nodes.push(node);
        Ok(self.nodes.len() - 1)
    }

    /// Promotes learner `i` to a voting member (`etcdctl member promote`), retried while etcd
    /// says the learner is not in sync yet (at most [`RECONFIG_WAIT`]).
    pub fn promote(&mut self, i: usize) -> Result<(), EtcdError> {
        let id = format!("{:x}", self.member_id(i)?);
        let started = Instant::now();
        loop {
            match self.member_change(&["member", "promote", &id], None) {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.to_string().contains("in sync with leader")
                        && started.elapsed() < RECONFIG_WAIT =>
                {
                    sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes member `i` from the member list and kills its process at once, frozen or not:
    /// what deleting a Machine does after KCP removed its member (the VM goes away).
    pub fn remove_and_stop(&mut self, i: usize) -> Result<(), EtcdError> {
        let id = format!("{:x}", self.member_id(i)?);
        self.member_change(&["member", "remove", &id], Some(i))?;
        self.kill(i);
        Ok(())
    }
}

fn parse_member_list(out: &str) -> Result<Vec<ListedMember>, EtcdError> {
    let bad = |why: String| EtcdError::Output {
        what: "member list",
        why,
    };
    let v: serde_json::Value =
        serde_json::from_str(out).map_err(|e| bad(format!("not JSON ({e}): {out}")))?;
    let members = v["members"]
        .as_array()
        .ok_or_else(|| bad(format!("no members: {out}")))?;
    members
        .iter()
        .map(|m| {
            let id = m["ID"]
                .as_u64()
                .ok_or_else(|| bad(format!("a member without a u64 ID: {m}")))?;
            Ok(ListedMember {
                id,
                name: m["name"].as_str().unwrap_or("").to_string(),
                learner: m["isLearner"].as_bool().unwrap_or(false),
            })
        })
        .collect()
}
