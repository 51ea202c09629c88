//! Criterion benchmarks of the decision core (issue 6, part 1): a Machine-deletion decision (the
//! whole verdict, and the webhook's `admit_deletion`) and a next-action computation on 3-, 5- and
//! 7-member control planes, and the whole review path for a
//! real-sized (10 KB) Machine DELETE AdmissionReview: parse, decide, serialize the response.
//!
//! Run: `cargo bench --bench core` (targets: a decision under 2 µs; parse + decide + serialize
//! under 20 µs). `cargo bench --bench core -- --quick` is a short smoke run.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use quorumguard::admission::ReviewReason;
use quorumguard::admission::review::{self, Endpoint};
use quorumguard::engine::model::{
    Cluster, ControlPlane, EtcdSnapshot, EtcdState, EtcdTopology, Health, HealthCheck,
    HealthChecks, Kcp, Machine, Member,
};
use quorumguard::engine::{
    EtcdBasis, Operation, Policy, Requester, admit_deletion, decide, next_action,
};
use serde_json::Value;
use testkit::reviews::machine_delete_10k;

const NOW: i64 = 1_790_000_000;

/// A healthy stacked control plane of `n` Machines, each with its voting member.
fn control_plane(n: usize) -> ControlPlane {
    let machines = (0..n)
        .map(|i| {
            let mut m = Machine::new(format!("cp-{i}"));
            m.node_name = Some(format!("node-{i}"));
            m.control_plane = true;
            m.created_unix = Some(NOW - 86_400);
            m
        })
        .collect();
    let members = (0..n)
        .map(|i| {
            let mut m = Member::new(0x1000 + i as u64, format!("node-{i}"));
            m.health = Health::Healthy;
            m.is_leader = i == 0;
            m.client_urls = vec![format!("https://10.0.0.{i}:2379")];
            m.version = Some("3.5.21".into());
            m
        })
        .collect();
    ControlPlane {
        cluster: Cluster {
            name: "c".into(),
            deleting: false,
            paused: false,
        },
        kcp: Kcp {
            name: "c-cp".into(),
            namespace: "ns".into(),
            replicas: n as u32,
            etcd: EtcdTopology::Stacked,
            max_surge: 1,
            deleting: false,
            version: Some("v1.33.1".into()),
            etcd_learner_mode: None,
            paused: false,
        },
        health_checks: HealthChecks::Known(vec![HealthCheck::covering("c-mhc", &machines)]),
        machines,
        etcd: EtcdState::Observed(EtcdSnapshot {
            members,
            age: Some(Duration::from_secs(3)),
        }),
    }
}

fn decisions(c: &mut Criterion) {
    let policy = Policy::default();
    let kcp = Requester::new(
        "system:serviceaccount:capi-kubeadm-control-plane-system:capi-kubeadm-control-plane-manager",
    );
    let mut g = c.benchmark_group("decision");
    for n in [3, 5, 7] {
        let cp = control_plane(n);
        let op = Operation::DeleteMachine(cp.machines[n - 1].clone());
        g.bench_with_input(BenchmarkId::new("delete_machine", n), &cp, |b, cp| {
            b.iter(|| decide(black_box(cp), black_box(&op), &kcp, &policy, NOW))
        });
        // The webhook's decision: the same verdict, without the next action an allowed one
        // does not show.
        let m = &cp.machines[n - 1];
        g.bench_with_input(BenchmarkId::new("admit_delete_machine", n), &cp, |b, cp| {
            b.iter(|| {
                admit_deletion(
                    black_box(cp),
                    black_box(m),
                    &kcp,
                    &policy,
                    NOW,
                    EtcdBasis::Record,
                )
            })
        });
        g.bench_with_input(BenchmarkId::new("next_action", n), &cp, |b, cp| {
            b.iter(|| next_action(black_box(cp), &policy, NOW))
        });
    }
    g.finish();
}

fn review_path(c: &mut Criterion) {
    let body = machine_delete_10k();
    let w = testkit::webhook::fixture_control_plane();
    // The path the HTTP handler takes, without the HTTP.
    let once = |body: &[u8]| -> Vec<u8> {
        let d = review::decode(Endpoint::Machines, body).expect("decodes");
        let o = w.judge(&d);
        assert!(
            matches!(o.reason, ReviewReason::Engine(_)),
            "no verdict: {}",
            o.reason
        );
        serde_json::to_vec(&o.response(&d.uid)).expect("serializes")
    };
    let first: Value = serde_json::from_slice(&once(&body)).expect("response");
    assert_eq!(first["response"]["allowed"], false, "{first:#}");
    let mut g = c.benchmark_group("review");
    g.throughput(criterion::Throughput::Bytes(body.len() as u64));
    g.bench_function("machine_delete_10k_parse_decide_serialize", |b| {
        b.iter(|| once(black_box(&body)))
    });
    g.bench_function("machine_delete_10k_json_value_only", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&body)).expect("json"))
    });
    // The floor of any serde_json reading: every byte tokenized, nothing built.
    g.bench_function("machine_delete_10k_json_skip_only", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&body)).expect("json"))
    });
    g.bench_function("machine_delete_10k_parse_only", |b| {
        b.iter(|| review::decode(Endpoint::Machines, black_box(&body)).expect("decodes"))
    });
    // The rest of the path, on the decoded review: the decision against the caches (with its
    // messages), then the response built and serialized.
    let decoded = review::decode(Endpoint::Machines, &body).expect("decodes");
    g.bench_function("machine_delete_10k_judge_only", |b| {
        b.iter(|| w.judge(black_box(&decoded)))
    });
    let v = w.judge(&decoded);
    assert!(matches!(v.reason, ReviewReason::Engine(_)), "{}", v.reason);
    g.bench_function("machine_delete_10k_respond_only", |b| {
        b.iter(|| serde_json::to_vec(&v.response(black_box(&decoded.uid))).expect("serializes"))
    });
    g.finish();
}

criterion_group!(benches, decisions, review_path);
criterion_main!(benches);
