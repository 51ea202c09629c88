//! Issue 38's stories on the playground (real etcd, the stand-in, the real webhook, `serve` in
//! process with the autopilot): each starts stuck, with the KCP annotated
//! `quorumguard.io/autopilot: dry-run`, and shows first that the autopilot only says what it
//! would do (the NextAction condition carries its words, and etcd and the Machines stay as they
//! are: without the autopilot acting, nothing gets the cluster out), then, with the annotation
//! `on`, that it converges with no human step and that no published status ever said the quorum
//! was lost. The failure-halfway story freezes the learner just before its promotion is due: the
//! autopilot refuses, says why in an Event, and promotes it once it is back.
//!
//! The clocks are shortened for a test (the autopilot's interval 2 s, KCP's chance 2 s); what
//! the autopilot proves before acting is not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use quorumguard::engine::autopilot::{ANNOTATION_AUTOPILOT, Mode, Settings};
use quorumguard::playground::kcp::{KcpController, Step, Style};
use quorumguard::playground::timeline::{Sink, Timeline};
use quorumguard::playground::world::{
    HUMAN, KCP, NAMESPACE, NEW_VERSION, RealApiPlan, Start, World, WorldOptions,
};
use quorumguard::server::autopilot::AutopilotConfig;
use serde_json::json;
use testkit::https::TempDir;

/// The most a story waits for one thing to happen: a few sweeps, the autopilot's interval and
/// KCP's chance, with room for a loaded machine.
const WAIT: Duration = Duration::from_secs(60);

/// A 2 MiB quota: filled by about 20 writes of 120 KiB (an argument of etcdctl's: under
/// Linux's 128 KiB limit on one argument).
const QUOTA: u64 = 2 * 1024 * 1024;

fn autopilot() -> AutopilotConfig {
    AutopilotConfig {
        mode: Mode::On,
        settings: Settings {
            interval: Duration::from_secs(2),
            kcp_chance: Duration::from_secs(2),
            quota_backend_bytes: QUOTA,
            ..Settings::default()
        },
        max_acting: 1,
        call_timeout: Duration::from_secs(10),
    }
}

/// A world of three members with the autopilot on, and the KCP annotated dry-run.
async fn world(dir: &TempDir, etcd_flags: &[&str]) -> Arc<World> {
    world_on(dir, etcd_flags, None).await
}

/// [`world`] on the stand-in, or on a real kube-apiserver with `real_api`.
async fn world_on(dir: &TempDir, etcd_flags: &[&str], real_api: Option<RealApiPlan>) -> Arc<World> {
    let options = WorldOptions {
        autopilot: Some(autopilot()),
        etcd_flags: etcd_flags.iter().map(|f| f.to_string()).collect(),
        real_api,
        ..WorldOptions::new(dir.path().to_path_buf())
    };
    let world = Arc::new(
        World::start(options, |_| {})
            .await
            .expect("the playground starts"),
    );
    annotate(&world, "dry-run").await;
    world
}

async fn annotate(world: &World, mode: &str) {
    let kcps: Api<DynamicObject> = Api::namespaced_with(
        world.client_as(HUMAN).expect("a client"),
        NAMESPACE,
        &quorumguard::state::watch::api_resource(quorumguard::state::Kind::Kcp),
    );
    kcps.patch(
        KCP,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_AUTOPILOT: mode}}})),
    )
    .await
    .unwrap_or_else(|e| panic!("annotating the KCP {mode}: {e}"));
}

/// What the story saw while it waited: the message of every published EtcdQuorum that said the
/// quorum was lost.
#[derive(Default)]
struct Seen {
    quorum_lost: Vec<String>,
}

/// Waits (at most [`WAIT`], polling every 200 ms) until `ok` holds of the world; records every
/// published EtcdQuorum that says the quorum was lost.
async fn until<T>(
    world: &World,
    seen: &mut Seen,
    what: &str,
    mut ok: impl AsyncFnMut(&World) -> Option<T>,
) -> T {
    let started = Instant::now();
    for _ in 0..(WAIT.as_millis() / 200) {
        let c = world.conditions();
        if c.quorum_reason() == "QuorumLost" {
            seen.quorum_lost.push(
                c.quorum
                    .as_ref()
                    .map(|q| q.message.clone())
                    .unwrap_or_default(),
            );
        }
        if let Some(t) = ok(world).await {
            return t;
        }
        if started.elapsed() > WAIT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let c = world.conditions();
    panic!(
        "{what}: not within {WAIT:?}. EtcdQuorum {}: {}\nNextAction {}: {}",
        c.quorum_reason(),
        c.quorum.as_ref().map_or("", |q| q.message.as_str()),
        c.action(),
        c.next_action.as_ref().map_or("", |a| a.message.as_str()),
    );
}

/// Prints a story's figure (`cargo test --workspace --test slow -- playground::autopilot
/// --nocapture`): how long from `since` (when `from` happened: the autopilot turned on, a member
/// thawed) to `what`.
fn figure(story: &str, from: &str, what: &str, since: Instant) {
    println!(
        "figure: {story}: {from} -> {what}: {:.1} s",
        since.elapsed().as_secs_f64()
    );
}

/// How long a story lets the dry run stand once it says what it would do, before it looks that
/// nothing was done: four sweeps, each of which the autopilot in `on` would have acted in.
const DRY_RUN_HOLD: Duration = Duration::from_secs(2);

/// Waits until the NextAction condition carries the autopilot's dry-run words containing
/// `would`, then [`DRY_RUN_HOLD`]; returns the condition's message.
async fn dry_run_says(world: &World, seen: &mut Seen, would: &str) -> String {
    let said = until(
        world,
        seen,
        &format!("the dry run says it would {would}"),
        async |w| {
            let c = w.conditions();
            let m = c.next_action.as_ref()?.message.clone();
            (m.contains("Autopilot (dry-run) would") && m.contains(would)).then_some(m)
        },
    )
    .await;
    tokio::time::sleep(DRY_RUN_HOLD).await;
    said
}

/// The Events about the KCP, as `(reason, note)`.
async fn kcp_events(world: &World) -> Vec<(String, String)> {
    let events: Api<DynamicObject> = Api::namespaced_with(
        world.client_as(HUMAN).expect("a client"),
        NAMESPACE,
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "events.k8s.io",
            "v1",
            "Event",
        )),
    );
    let list = events.list(&Default::default()).await.expect("Events list");
    list.items
        .into_iter()
        .filter(|e| e.data["regarding"]["name"] == KCP)
        .map(|e| {
            (
                e.data["reason"].as_str().unwrap_or("").to_string(),
                e.data["note"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Waits until an Event with `reason` whose note contains `text` is on the KCP.
async fn event(world: &World, seen: &mut Seen, reason: &str, text: &str) -> String {
    until(
        world,
        seen,
        &format!("an Event {reason} about {text}"),
        async |w| {
            kcp_events(w)
                .await
                .into_iter()
                .find(|(r, n)| r == reason && n.contains(text))
                .map(|(_, n)| n)
        },
    )
    .await
}

/// Waits ([`until`]) until etcd lists `learner` as a voting member.
async fn until_voting(world: &World, seen: &mut Seen, learner: &str, what: &str) {
    until(world, seen, what, async |w| {
        (is_learner(&listed(w).await, learner) == Some(false)).then_some(())
    })
    .await;
}

/// etcd's members as `(id, name, learner)`.
async fn listed(world: &World) -> Vec<(u64, String, bool)> {
    world
        .etcd(|e| {
            e.member_list()
                .expect("member list")
                .into_iter()
                .map(|m| (m.id, m.name, m.learner))
                .collect()
        })
        .await
        .expect("etcd")
}

fn is_learner(members: &[(u64, String, bool)], name: &str) -> Option<bool> {
    members.iter().find(|m| m.1 == name).map(|m| m.2)
}

/// Runs `story` in a [`world`] on the stand-in, in a fresh directory named after `dir`.
fn on_the_stand_in(dir: &str, story: impl AsyncFnOnce(&Arc<World>)) {
    let _slot = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new(dir);
        let world = world(&dir, &[]).await;
        story(&world).await;
        world.shutdown().await;
    });
}

/// A learner nobody promotes ([`Start::LearnerNotPromoted`]), once the dry run says it would
/// promote it: its name, and what the NextAction condition says.
async fn learner_due(world: &World, seen: &mut Seen) -> (String, String) {
    let learner = world
        .apply_start(Start::LearnerNotPromoted)
        .await
        .expect("a learner nobody promotes")
        .expect("its name");
    let said = dry_run_says(world, seen, &format!("promote learner {learner}")).await;
    (learner, said)
}

/// A learner nobody promotes: dry-run says so and does nothing; on promotes it, says so in an
/// Event, and the next probe confirms it.
async fn learner_story(world: &World) {
    let mut seen = Seen::default();
    let (learner, said) = learner_due(world, &mut seen).await;
    assert_eq!(
        is_learner(&listed(world).await, &learner),
        Some(true),
        "dry-run promoted it: {said}"
    );
    event(world, &mut seen, "AutopilotDryRun", &learner).await;

    annotate(world, "on").await;
    let on = Instant::now();
    until_voting(world, &mut seen, &learner, "the learner is a voting member").await;
    figure("learner never promoted", "autopilot on", "voting", on);
    let acted = event(world, &mut seen, "AutopilotActed", &learner).await;
    assert!(
        acted.contains("before ") && acted.contains("after "),
        "{acted}"
    );
    event(world, &mut seen, "AutopilotStepConfirmed", &learner).await;
    assert!(seen.quorum_lost.is_empty(), "{:?}", seen.quorum_lost);
}

#[test]
fn a_learner_never_promoted_is_promoted_by_the_autopilot() {
    on_the_stand_in("pg-ap-learner", async |world| learner_story(world).await);
}

#[test]
fn a_learner_frozen_just_before_its_promotion_is_refused_then_promoted() {
    on_the_stand_in("pg-ap-halfway", async |world| {
        let mut seen = Seen::default();
        let (learner, _) = learner_due(world, &mut seen).await;
        // The promotion is due: the learner stops answering just before the autopilot acts.
        // Whichever probe sees it first, the autopilot says why it does not promote, in an
        // AutopilotRefused Event naming the learner: its own fresh probe (the step is not
        // proven), or the sweep's (the published next action is no longer the promotion: said
        // once, with what is published now).
        world.freeze_member(&learner).await.expect("freeze");
        annotate(world, "on").await;
        let why = event(world, &mut seen, "AutopilotRefused", &learner).await;
        println!("refused: {why}");
        assert!(why.contains("Next:"), "says what comes next: {why}");
        assert_eq!(
            is_learner(&listed(world).await, &learner),
            Some(true),
            "promoted while frozen: {why}"
        );
        assert!(
            !kcp_events(world)
                .await
                .iter()
                .any(|(r, _)| r == "AutopilotActed"),
            "acted while the learner was frozen"
        );
        world.thaw_member(&learner).await.expect("thaw");
        let thawed = Instant::now();
        until_voting(
            world,
            &mut seen,
            &learner,
            "the learner is promoted once back",
        )
        .await;
        figure(
            "learner frozen before its promotion",
            "thawed",
            "voting",
            thawed,
        );
        assert!(seen.quorum_lost.is_empty(), "{:?}", seen.quorum_lost);
    });
}

/// A voting member added (`member add`, as kubeadm before learner mode) whose etcd never
/// started: four voting members, three healthy. dry-run says it would remove it and does not;
/// on removes it after KCP's chance.
async fn unstarted_story(world: &World, api: &str) {
    let mut seen = Seen::default();
    world
        .etcd(|e| e.add_member("never-started").map(|_| ()))
        .await
        .expect("etcd")
        .expect("member add");
    assert_eq!(listed(world).await.len(), 4);
    dry_run_says(world, &mut seen, "remove etcd member").await;
    assert_eq!(listed(world).await.len(), 4, "dry-run removed it");

    annotate(world, "on").await;
    let on = Instant::now();
    until(world, &mut seen, "the member is removed", async |w| {
        (listed(w).await.len() == 3).then_some(())
    })
    .await;
    // KCP's chance (2 s here) is counted from when the action was first published: it ran out
    // during the dry run.
    figure(
        &format!("member never started ({api})"),
        "autopilot on",
        "removed",
        on,
    );
    let names: Vec<String> = listed(world).await.into_iter().map(|m| m.1).collect();
    assert!(names.iter().all(|n| !n.is_empty()), "{names:?}");
    event(world, &mut seen, "AutopilotActed", "never started").await;
    assert!(seen.quorum_lost.is_empty(), "{:?}", seen.quorum_lost);
}

#[test]
fn a_member_added_that_never_started_is_removed_by_the_autopilot() {
    on_the_stand_in("pg-ap-unstarted", async |world| {
        unstarted_story(world, "stand-in").await
    });
}

/// [`unstarted_story`] on a real kube-apiserver (its CRD schemas, its Events API, the KCP's
/// annotation through it). Not the learner's story: a real API server sets a Machine's
/// creationTimestamp itself, so a learner there would stay within --learner-grace (15m).
/// Skipped without `KUBEBUILDER_ASSETS`, required with `QUORUMGUARD_REQUIRE_ENVTEST`.
#[test]
fn a_member_that_never_started_is_removed_on_a_real_apiserver() {
    let Some(assets) =
        testkit::envtest::assets("a_member_that_never_started_is_removed_on_a_real_apiserver")
    else {
        return;
    };
    // The API server's slot before the etcd slot, as every test that holds both.
    let _apiserver = testkit::envtest::slot();
    let _etcd = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-ap-real");
        let plan = RealApiPlan {
            assets,
            crds: testkit::envtest::capi_crds_dir(),
        };
        let world = world_on(&dir, &[], Some(plan)).await;
        assert!(world.api.stand_in().is_none());
        unstarted_story(&world, "real kube-apiserver").await;
        world.shutdown().await;
    });
}

#[test]
fn the_stuck_upgrade_of_2651_converges_with_the_autopilot() {
    on_the_stand_in("pg-ap-2651", async |world| {
        let mut seen = Seen::default();
        let old: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
        world
            .patch_kcp_spec(json!({ "version": NEW_VERSION }), HUMAN)
            .await
            .expect("the API server answers")
            .expect("the upgrade is allowed");
        // KCP v0.3 rolls: a new Machine and member, the oldest member removed, and it loses
        // its leader election before deleting the Machine (cluster-api #2651).
        let tl = Timeline::new(Sink::Memory);
        let mut kcp = KcpController::new(Arc::clone(world), tl.clone(), Style::V03);
        kcp.crash_after_member_removal = true;
        let mut crashed = false;
        for _ in 0..120 {
            if matches!(kcp.step().await.expect("a KCP step"), Step::Crashed(_)) {
                crashed = true;
                break;
            }
            tokio::time::sleep(world.settle_time()).await;
        }
        assert!(crashed, "KCP never lost its election:\n{}", tl.text());
        let stranded = old.first().cloned().expect("an old Machine");
        dry_run_says(world, &mut seen, &format!("delete Machine {stranded}")).await;
        assert!(
            world.machines().iter().any(|m| m.name == stranded),
            "dry-run deleted it"
        );

        annotate(world, "on").await;
        let on = Instant::now();
        // Deleted: KCP's pre-terminate hook and the Machine finalizer hold it until KCP and
        // the Machine controller are done with it.
        until(
            world,
            &mut seen,
            "the memberless Machine is deleting",
            async |w| {
                w.machines()
                    .iter()
                    .find(|m| m.name == stranded)
                    .is_none_or(|m| m.deleting)
                    .then_some(())
            },
        )
        .await;
        event(world, &mut seen, "AutopilotActed", &stranded).await;
        // KCP v0.3 restarts; it does not follow quorumguard's NextAction: nothing but the
        // autopilot got it out of "4 control plane nodes, but 3 etcd members".
        kcp.crash_after_member_removal = false;
        let mut converged = false;
        for _ in 0..240 {
            if kcp.step().await.expect("a KCP step") == Step::Converged {
                converged = true;
                break;
            }
            tokio::time::sleep(world.settle_time()).await;
        }
        assert!(converged, "the rollout did not converge:\n{}", tl.text());
        figure(
            "#2651 stuck upgrade",
            "autopilot on",
            "the rollout converged",
            on,
        );
        let machines = world.machines();
        assert_eq!(machines.len(), 3, "{machines:?}");
        assert!(
            machines
                .iter()
                .all(|m| m.version == NEW_VERSION && !old.contains(&m.name))
        );
        let mut names: Vec<String> = listed(world).await.into_iter().map(|m| m.1).collect();
        names.sort();
        let mut machine_names: Vec<String> = machines.into_iter().map(|m| m.name).collect();
        machine_names.sort();
        assert_eq!(names, machine_names);
        assert!(kcp.denials.is_empty(), "{:?}", kcp.denials);
        assert!(seen.quorum_lost.is_empty(), "{:?}", seen.quorum_lost);
    });
}

/// Fills etcd until it raises NOSPACE: one key overwritten with 120 KiB values (each revision
/// kept until a compaction), at most 100 writes.
async fn fill_until_nospace(world: &World) -> usize {
    let value = "x".repeat(120 * 1024);
    world
        .etcd(move |e| {
            for i in 0..100 {
                let endpoints = e.endpoints();
                match e.etcdctl(&endpoints, &["put", "filler", &value]) {
                    Ok(_) => {}
                    Err(err) if err.to_string().contains("database space exceeded") => return i,
                    Err(err) => panic!("put {i}: {err}"),
                }
            }
            panic!("no NOSPACE after 100 writes of 120 KiB");
        })
        .await
        .expect("etcd")
}

#[test]
fn nospace_is_freed_and_disarmed_by_the_autopilot() {
    let _slot = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-ap-nospace");
        let quota = format!("--quota-backend-bytes={QUOTA}");
        let world = world(&dir, &[quota.as_str()]).await;
        let mut seen = Seen::default();
        let writes = fill_until_nospace(&world).await;
        assert!(writes > 0, "NOSPACE before the first write");
        dry_run_says(&world, &mut seen, "compact").await;
        let alarms = world
            .etcd(|e| {
                let endpoints = e.endpoints();
                e.etcdctl(&endpoints, &["alarm", "list"])
            })
            .await
            .expect("etcd")
            .expect("alarm list");
        assert!(alarms.contains("NOSPACE"), "dry-run disarmed it: {alarms}");

        annotate(&world, "on").await;
        let on = Instant::now();
        until(&world, &mut seen, "the alarm is disarmed", async |w| {
            let alarms = w
                .etcd(|e| {
                    let endpoints = e.endpoints();
                    e.etcdctl(&endpoints, &["alarm", "list"])
                })
                .await
                .ok()?
                .ok()?;
            (!alarms.contains("NOSPACE")).then_some(())
        })
        .await;
        figure("NOSPACE", "autopilot on", "disarmed (6 steps)", on);
        // Writes work again.
        let put = world
            .etcd(|e| {
                let endpoints = e.endpoints();
                e.etcdctl(&endpoints, &["put", "after", "ok"])
            })
            .await
            .expect("etcd");
        assert!(put.is_ok(), "{put:?}");
        for step in [
            "compacts the history",
            "defragments etcd member",
            "moves the leadership",
            "disarms the NOSPACE alarm",
        ] {
            event(&world, &mut seen, "AutopilotActed", step).await;
        }
        assert!(seen.quorum_lost.is_empty(), "{:?}", seen.quorum_lost);
        world.shutdown().await;
    });
}
