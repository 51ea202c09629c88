//! The stuck states Cluster API users reported, as `check` sees them from their dumps: etcdctl's
//! JSON as etcd 3.4 prints it (tests/fixtures/etcd, edited where a state needs it) and the
//! rollout's kubectl dump (tests/fixtures/objects/rollout.yaml: replicas 3, four Machines, the
//! newest, demo-control-plane-r2d5v, created 2025-11-20T09:00:05Z for cp-node-4). Each state
//! names the action that leads out; its young look-alike still waits, with the time it ends.

use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

use super::*;
use quorumguard_engine::ActionCode;
use quorumguard_engine::next_action::FREE_SPACE_COMMAND;
use quorumguard_observe::dumps::{DumpTexts, assemble};

const M4: &str = "demo-control-plane-r2d5v";
/// cp-node-4's member ID (hex) in every etcd fixture.
const ID4: &str = "166e5d7609694859";
/// Three minutes after M4 was created: within --join-grace and --learner-grace.
const YOUNG: &str = "2025-11-20T09:03:05Z";
/// Three hours after: past both.
const OLD: &str = "2025-11-20T12:00:05Z";

fn fixture(rel: &str) -> String {
    let path = format!("{}/../../tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The rollout's objects, with `edit` applied to Machine M4 (`None` removes it) and Machines
/// named in `drop` left out.
fn objects(edit: impl Fn(&mut Yaml) -> bool, drop: &[&str]) -> String {
    let mut list: Yaml = serde_yaml::from_str(&fixture("objects/rollout.yaml")).unwrap();
    let items = list["items"].as_sequence_mut().unwrap();
    items.retain_mut(|o| {
        let name = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if drop.contains(&name.as_str()) {
            return false;
        }
        name != M4 || edit(o)
    });
    serde_yaml::to_string(&list).unwrap()
}

fn unchanged(_: &mut Yaml) -> bool {
    true
}

/// M4 as a failed join: no node.
fn without_node(m: &mut Yaml) -> bool {
    if let Some(status) = m["status"].as_mapping_mut() {
        status.remove("nodeRef");
    }
    true
}

/// An etcd fixture's file, as JSON, edited.
fn etcd(scenario: &str, file: &str, edit: impl Fn(&mut Json)) -> String {
    let mut v: Json = serde_json::from_str(&fixture(&format!("etcd/{scenario}/{file}"))).unwrap();
    edit(&mut v);
    v.to_string()
}

struct Dumps {
    objects: String,
    member_list: String,
    status: String,
    health: String,
    alarms: Option<String>,
}

impl Dumps {
    fn of(scenario: &str, objects: String) -> Dumps {
        Dumps {
            objects,
            member_list: etcd(scenario, "member-list.json", |_| ()),
            status: etcd(scenario, "endpoint-status.json", |_| ()),
            health: etcd(scenario, "endpoint-health.json", |_| ()),
            alarms: None,
        }
    }

    /// The next action `check --now AT` names.
    fn next(&self, at: &str) -> NextActionOut {
        let loaded = assemble(&DumpTexts {
            objects: ("objects.yaml", &self.objects),
            member_list: ("member-list.json", &self.member_list),
            endpoint_status: Some(("endpoint-status.json", &self.status)),
            endpoint_health: Some(("endpoint-health.json", &self.health)),
            alarms: self.alarms.as_deref().map(|a| ("alarms.json", a)),
            kcp: None,
        })
        .unwrap();
        let now = parse_time(at).unwrap();
        let who = Requester::new(DEFAULT_REQUESTER);
        analyse_with(loaded, &[], &who, &Policy::default(), now)
            .unwrap()
            .next_action
    }
}

fn assert_action(a: &NextActionOut, code: ActionCode, target: &str, command: Option<&str>) {
    assert_eq!(a.code, code.as_str(), "{}", a.message);
    assert_eq!(a.target.as_deref(), Some(target), "{}", a.message);
    assert_eq!(a.command.as_deref(), command, "{}", a.message);
}

/// `code` for cp-node-4's member, with the command `etcdctl member VERB ID`.
fn assert_etcdctl(a: &NextActionOut, code: ActionCode, verb: &str) {
    let cmd = format!("etcdctl member {verb} {ID4}");
    assert_action(a, code, ID4, Some(&cmd));
}

/// The action's message says `text`.
fn assert_says(a: &NextActionOut, text: &str) {
    assert!(a.message.contains(text), "{}", a.message);
}

/// RemediateMachine of M4, with its command.
fn assert_remediate_m4(a: &NextActionOut) {
    let cmd =
        format!("kubectl annotate machine -n demo {M4} cluster.x-k8s.io/remediate-machine=\"\"");
    assert_action(a, ActionCode::RemediateMachine, M4, Some(&cmd));
}

/// cluster-api #13221, #13667: a join failed after `member add --learner`; the learner never
/// started and no Machine accounts for it. etcd takes one learner at a time, so it blocks every
/// later join. Was WaitForJoin for ever.
#[test]
fn unstarted_learner_without_a_machine_is_removed() {
    let d = Dumps::of("learner-unstarted", objects(|_| false, &[]));
    let a = d.next(OLD);
    assert_etcdctl(&a, ActionCode::RemoveOrphanMember, "remove");
    assert_says(&a, "too many learner members");
    // Its young look-alike: the fourth Machine was created three minutes ago: joining, until
    // --join-grace ends.
    let d = Dumps::of("learner-unstarted", objects(unchanged, &[]));
    let a = d.next(YOUNG);
    assert_action(&a, ActionCode::WaitForJoin, ID4, None);
    assert_says(
        &a,
        &format!(
            "Machine demo/{M4}, the newest without an etcd member, was created at 2025-11-20T09:00:05Z; at 2025-11-20T09:10:05Z, after --join-grace 10m, the member counts as failed"
        ),
    );
}

/// cluster-api #5509: older kubeadm added the member as a voter; it never started. Fault
/// tolerance is 0 while it stays. Was WaitForJoin for ever.
#[test]
fn unstarted_voting_member_without_a_machine_is_removed() {
    let voter = |v: &mut Json| {
        for m in v["members"].as_array_mut().unwrap() {
            m.as_object_mut().unwrap().remove("isLearner");
        }
    };
    let mut d = Dumps::of("learner-unstarted", objects(|_| false, &[]));
    d.member_list = etcd("learner-unstarted", "member-list.json", voter);
    let a = d.next(OLD);
    assert_etcdctl(&a, ActionCode::RemoveOrphanMember, "remove");
    assert_says(&a, "with it etcd has fault tolerance 0");
    assert_says(&a, "#5509");
}

/// The same, with the Machine whose join failed (created long ago, never got a node): the
/// member goes first (it changes no healthy count and frees etcd's learner slot), then the
/// Machine is replaced. Was WaitForJoin for ever.
#[test]
fn failed_join_removes_the_member_then_replaces_the_machine() {
    let d = Dumps::of("learner-unstarted", objects(without_node, &[]));
    let a = d.next(OLD);
    assert_etcdctl(&a, ActionCode::RemoveOrphanMember, "remove");
    assert_says(
        &a,
        &format!("Then Machine demo/{M4}, whose join failed, is replaced"),
    );
    // Once the member is gone: the Machine, which has no member, is remediated.
    let mut after = Dumps::of("learner-unstarted", objects(without_node, &[]));
    after.member_list = etcd("learner-unstarted", "member-list.json", |v| {
        v["members"]
            .as_array_mut()
            .unwrap()
            .retain(|m| m["name"].is_string());
    });
    let a = after.next(OLD);
    assert_remediate_m4(&a);
    // Young look-alike: the Machine was created three minutes ago.
    let a = d.next(YOUNG);
    assert_action(&a, ActionCode::WaitForJoin, ID4, None);
}

/// A join interrupted after `member add`: the learner runs and has caught up, but nobody
/// promotes it. Was WaitForLearner for ever.
#[test]
fn stalled_learner_is_promoted_when_caught_up_else_replaced() {
    let d = Dumps::of("learner", objects(unchanged, &[]));
    let a = d.next(OLD);
    assert_etcdctl(&a, ActionCode::PromoteLearner, "promote");
    assert_says(
        &a,
        "becomes a healthy voter (4 healthy of 4 voting members, quorum 3)",
    );
    // Behind the leader (raft index 3 of 34): etcd would refuse; its Machine is replaced.
    let mut behind = Dumps::of("learner", objects(unchanged, &[]));
    behind.status = etcd("learner", "endpoint-status.json", |v| {
        for e in v.as_array_mut().unwrap() {
            if e["Status"]["isLearner"] == true {
                e["Status"]["raftIndex"] = 3.into();
            }
        }
    });
    let a = behind.next(OLD);
    assert_remediate_m4(&a);
    // Young look-alike: a learner of a Machine created three minutes ago is catching up.
    let a = d.next(YOUNG);
    assert_action(&a, ActionCode::WaitForLearner, ID4, None);
    assert_says(
        &a,
        "(its Machine demo/demo-control-plane-r2d5v, created at 2025-11-20T09:00:05Z; at 2025-11-20T09:15:05Z, after --learner-grace 15m, it counts as stalled)",
    );
}

/// A NOSPACE alarm (`etcdctl alarm list -w json`): a new member would receive the same data,
/// so the action frees space. Was RemediateMachine for the member that raised it. CORRUPT stays
/// RemediateMachine.
#[test]
fn nospace_frees_space_and_corrupt_is_remediated() {
    // The nospace fixture's members are cp-node-2, -3, -4: leave cp-node-1's Machine out.
    let objects = objects(unchanged, &["demo-control-plane-x7k2p"]);
    let alarm = |n: u64| {
        format!(
            r#"{{"header":{{"cluster_id":2497353551676525385,"member_id":6147269841369651596,"revision":38,"raft_term":10}},"alarms":[{{"memberID":1616332077818005593,"alarm":{n}}}]}}"#
        )
    };
    let mut d = Dumps::of("nospace", objects.clone());
    // The alarm list alone says it: status errors left out.
    d.status = etcd("nospace", "endpoint-status.json", |v| {
        for e in v.as_array_mut().unwrap() {
            e["Status"].as_object_mut().unwrap().remove("errors");
        }
    });
    d.alarms = Some(alarm(1));
    let a = d.next(OLD);
    assert_action(&a, ActionCode::FreeSpace, ID4, Some(FREE_SPACE_COMMAND));
    assert_says(&a, "cp-node-4 (id 166e5d7609694859)");
    d.alarms = Some(alarm(2));
    let a = d.next(OLD);
    assert_remediate_m4(&a);
    assert_says(&a, "alarm CORRUPT");
    // No alarm listed: converged.
    d.alarms = Some(r#"{"header":{"cluster_id":2497353551676525385}}"#.into());
    assert_eq!(d.next(OLD).code, "None");
}
