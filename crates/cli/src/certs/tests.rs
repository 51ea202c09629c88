//! The unit tests of `quorumguard certs`: names, the bundle, the patch, the files, quoting.

use super::bundle::*;
use super::files::*;
use super::webhook::*;
use super::*;

use std::fs;

use k8s_openapi::ByteString;
use rcgen::{KeyPair, PublicKeyData};
use serde_json::{Value, json};

use quorumguard_pki::certs::testkit::{DAY, NOW, TempDir, facts};

fn request() -> Request {
    Request {
        service: DEFAULT_SERVICE.to_string(),
        namespace: DEFAULT_NAMESPACE.to_string(),
        extra_names: vec![],
        days: DEFAULT_DAYS,
        ca: None,
    }
}

fn leaf_of(bundle: &Bundle) -> String {
    let end = "-----END CERTIFICATE-----\n";
    let i = bundle.chain_pem.find(end).expect("a certificate") + end.len();
    bundle.chain_pem[..i].to_string()
}

#[test]
fn service_names_cover_every_form_the_api_server_may_dial() {
    let names = service_dns_names("quorumguard-webhook", "quorumguard-system", &[]).unwrap();
    assert_eq!(
        names,
        [
            "quorumguard-webhook",
            "quorumguard-webhook.quorumguard-system",
            "quorumguard-webhook.quorumguard-system.svc",
            "quorumguard-webhook.quorumguard-system.svc.cluster.local",
        ]
    );
    let extra = vec![
        "webhook.example.com".to_string(),
        "*.apps.example.com".to_string(),
        "10.0.0.7".to_string(),
        "fd00::7".to_string(),
        "webhook.example.com".to_string(),
        "svc.ns".to_string(),
    ];
    let names = service_dns_names("svc", "ns", &extra).unwrap();
    assert_eq!(
        names[4..],
        [
            "webhook.example.com",
            "*.apps.example.com",
            "10.0.0.7",
            "fd00::7"
        ],
        "extras keep their order, without duplicates"
    );
}

#[test]
fn bad_names_are_refused_with_the_flag_named() {
    for (svc, ns, extra, flag) in [
        ("Webhook", "ns", "", "--service"),
        ("-svc", "ns", "", "--service"),
        ("", "ns", "", "--service"),
        ("svc", "ns_1", "", "--namespace"),
        ("svc", &"n".repeat(64), "", "--namespace"),
        ("svc", "ns", "bad..name", "--dns-name"),
        ("svc", "ns", "UPPER.example.com", "--dns-name"),
        ("svc", "ns", "a.*.example.com", "--dns-name"),
        ("svc", "ns", "space name", "--dns-name"),
    ] {
        let extra: Vec<String> = (!extra.is_empty())
            .then(|| extra.to_string())
            .into_iter()
            .collect();
        let err = service_dns_names(svc, ns, &extra).unwrap_err();
        assert!(
            matches!(&err, CertError::InvalidName { what, .. } if *what == flag),
            "{svc} {ns} {extra:?}: {err}"
        );
    }
    let long = format!("{}.com", vec!["a".repeat(63); 4].join("."));
    assert!(service_dns_names("svc", "ns", &[long]).is_err());
}

#[test]
fn generate_makes_a_new_ca_and_a_chain_with_exact_validity() {
    let bundle = generate(&request(), NOW).unwrap();
    let ca = facts(&bundle.ca_cert_pem);
    assert_eq!(ca.ca, Some(true));
    assert_eq!(ca.not_after, NOW + 3650 * DAY);
    assert_eq!(bundle.ca_not_after, NOW + 3650 * DAY);

    let leaf = facts(&leaf_of(&bundle));
    assert_eq!(leaf.ca, Some(false));
    assert_eq!(leaf.eku, Some((true, false)), "serverAuth only");
    assert_eq!(leaf.not_after, NOW + 365 * DAY);
    assert_eq!(bundle.not_after, NOW + 365 * DAY);
    assert_eq!(leaf.issuer, ca.subject);

    // tls.crt is the leaf, then the CA.
    assert_eq!(bundle.chain_pem.matches("BEGIN CERTIFICATE").count(), 2);
    assert!(bundle.chain_pem.ends_with(&bundle.ca_cert_pem));
    // Both keys are PKCS#8 and usable.
    let ca_key = bundle.new_ca_key_pem.as_deref().expect("new CA key");
    assert_eq!(
        KeyPair::from_pem(ca_key).unwrap().der_bytes(),
        ca.public_key
    );
    assert_eq!(
        KeyPair::from_pem(&bundle.key_pem).unwrap().der_bytes(),
        leaf.public_key
    );
    let names: Vec<&str> = bundle.dns_names.iter().map(String::as_str).collect();
    assert_eq!(names[2], "quorumguard-webhook.quorumguard-system.svc");
    let decoded: ByteString =
        serde_json::from_value(Value::String(bundle.ca_bundle().unwrap())).unwrap();
    assert_eq!(decoded.0, bundle.ca_cert_pem.as_bytes(), "caBundle");
}

#[test]
fn the_common_name_is_the_service_name_unless_too_long() {
    let cn_of = |req: &Request| facts(&leaf_of(&generate(req, NOW).unwrap())).cn;
    assert_eq!(
        cn_of(&request()),
        "quorumguard-webhook.quorumguard-system.svc"
    );
    let long = Request {
        service: "guard".to_string(),
        namespace: "n".repeat(60),
        ..request()
    };
    assert_eq!(cn_of(&long), "guard");
}

#[test]
fn days_bound_the_serving_certificate() {
    for days in [1, 30, 3650] {
        let bundle = generate(&Request { days, ..request() }, NOW).unwrap();
        assert_eq!(bundle.not_after, NOW + i64::from(days) * DAY);
    }
    for days in [0, 3651] {
        let err = generate(&Request { days, ..request() }, NOW).unwrap_err();
        assert!(
            matches!(err, CertError::InvalidDays(d) if d == days),
            "{err}"
        );
    }
}

#[test]
fn a_given_ca_is_reused_and_keeps_the_ca_bundle() {
    let first = generate(&request(), NOW).unwrap();
    let ca_key = first.new_ca_key_pem.clone().unwrap();
    let later = NOW + 300 * DAY;
    let with_ca = |now| {
        let ca = Some((first.ca_cert_pem.clone(), ca_key.clone()));
        generate(&Request { ca, ..request() }, now)
    };
    let second = with_ca(later).unwrap();
    assert_eq!(second.ca_cert_pem, first.ca_cert_pem);
    assert_eq!(second.ca_bundle().unwrap(), first.ca_bundle().unwrap());
    assert!(
        second.new_ca_key_pem.is_none(),
        "a given CA key is not rewritten"
    );
    let leaf = facts(&leaf_of(&second));
    assert_eq!(leaf.issuer, facts(&first.ca_cert_pem).subject);
    assert_eq!(leaf.not_after, later + 365 * DAY);
    assert_ne!(leaf_of(&second), leaf_of(&first));
    let files: Vec<&str> = second.files().iter().map(|f| f.name).collect();
    assert_eq!(files, [CA_CERT_FILE, CERT_FILE, KEY_FILE]);

    // The CA would expire before the serving certificate.
    let err = with_ca(NOW + 3600 * DAY).unwrap_err();
    assert!(matches!(err, CertError::CaExpiresFirst { .. }), "{err}");
    // Only a PKCS#8 key, with a hint to convert another.
    let labels = ["EC PRIVATE KEY", "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY"];
    let keys = labels.map(|l| format!("-----BEGIN {l}-----\nAAAA\n-----END {l}-----\n"));
    for key in keys.iter().map(String::as_str).chain(["garbage"]) {
        let ca = Some((first.ca_cert_pem.clone(), key.to_string()));
        let err = generate(&Request { ca, ..request() }, NOW).unwrap_err();
        assert!(matches!(err, CertError::CaKey(_)), "{err}");
        assert!(err.to_string().contains("openssl pkcs8 -topk8"), "{err}");
    }
}

#[test]
fn the_patch_sets_every_webhook_and_checks_each_name() {
    let names = vec![
        "machines.quorumguard.io".to_string(),
        "kcp.quorumguard.io".to_string(),
    ];
    let patch = ca_bundle_patch(&names, "Q0E=");
    assert_eq!(
        patch,
        json!([
            {"op": "test", "path": "/webhooks/0/name", "value": "machines.quorumguard.io"},
            {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="},
            {"op": "test", "path": "/webhooks/1/name", "value": "kcp.quorumguard.io"},
            {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "Q0E="},
        ])
    );
    let mut vwc = json!({"webhooks": [
        {"name": "machines.quorumguard.io", "clientConfig": {"caBundle": "b2xk"}},
        {"name": "kcp.quorumguard.io", "clientConfig": {"service": {"name": "s"}}},
    ]});
    let p: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    json_patch::patch(&mut vwc, &p).unwrap();
    assert_eq!(vwc["webhooks"][0]["clientConfig"]["caBundle"], "Q0E=");
    assert_eq!(vwc["webhooks"][1]["clientConfig"]["caBundle"], "Q0E=");
    assert_eq!(vwc["webhooks"][1]["clientConfig"]["service"]["name"], "s");
    // Reordered since it was read: the patch fails instead of mixing them up.
    let mut reordered = json!({"webhooks": [
        {"name": "kcp.quorumguard.io", "clientConfig": {}},
        {"name": "machines.quorumguard.io", "clientConfig": {}},
    ]});
    assert!(json_patch::patch(&mut reordered, &p).is_err());
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[cfg(unix)]
#[test]
fn files_are_written_with_key_modes_and_never_overwritten_without_force() {
    let tmp = TempDir::new("write");
    let dir = tmp.0.join("out");
    let bundle = generate(&request(), NOW).unwrap();
    let paths = write_files(&dir, &bundle.files(), false).unwrap();
    let names: Vec<String> = paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [CA_CERT_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE]);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(CA_CERT_FILE)), 0o644);
    assert_eq!(mode(&dir.join(CA_KEY_FILE)), 0o600);
    assert_eq!(mode(&dir.join(CERT_FILE)), 0o644);
    assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
    assert_eq!(
        fs::read_to_string(dir.join(CERT_FILE)).unwrap(),
        bundle.chain_pem
    );
    assert_eq!(
        fs::read_to_string(dir.join(KEY_FILE)).unwrap(),
        bundle.key_pem
    );

    // Only one file in the way: nothing at all is written, and the message names it.
    let other = generate(&request(), NOW).unwrap();
    let dir2 = tmp.0.join("out2");
    fs::create_dir_all(&dir2).unwrap();
    fs::write(dir2.join(KEY_FILE), "keep me").unwrap();
    let err = write_files(&dir2, &other.files(), false).unwrap_err();
    assert!(
        matches!(&err, WriteError::Exists(p) if p == &[dir2.join(KEY_FILE)]),
        "{err}"
    );
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(fs::read_to_string(dir2.join(KEY_FILE)).unwrap(), "keep me");
    assert!(!dir2.join(CA_CERT_FILE).exists());

    // Without force the first run's files stay; with force they are replaced, and a key
    // that had been opened up gets its 0600 back.
    assert!(matches!(
        write_files(&dir, &other.files(), false),
        Err(WriteError::Exists(p)) if p.len() == 4
    ));
    assert_eq!(
        fs::read_to_string(dir.join(KEY_FILE)).unwrap(),
        bundle.key_pem
    );
    fs::set_permissions(
        dir.join(KEY_FILE),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    write_files(&dir, &other.files(), true).unwrap();
    assert_eq!(
        fs::read_to_string(dir.join(KEY_FILE)).unwrap(),
        other.key_pem
    );
    assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
    let leftovers: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "no temporary files left behind");

    // --force replaces a symlink rather than writing through it.
    let target = tmp.0.join("elsewhere");
    fs::write(&target, "not a key").unwrap();
    fs::remove_file(dir.join(KEY_FILE)).unwrap();
    std::os::unix::fs::symlink(&target, dir.join(KEY_FILE)).unwrap();
    write_files(&dir, &other.files(), true).unwrap();
    assert_eq!(fs::read_to_string(&target).unwrap(), "not a key");
    assert!(
        !fs::symlink_metadata(dir.join(KEY_FILE))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn a_broken_clock_is_refused() {
    // Just outside 2000-01-01 and 3000-01-01.
    for now in [0, 946_684_799, 32_503_680_001] {
        let err = generate(&request(), now).unwrap_err();
        assert!(matches!(err, CertError::Clock(n) if n == now), "{err}");
    }
}

#[test]
fn debug_output_never_shows_a_key() {
    let bundle = generate(&request(), NOW).unwrap();
    for shown in [format!("{bundle:?}"), format!("{:?}", bundle.files())] {
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    }
}

#[test]
fn kubectl_command_and_quoting() {
    assert_eq!(
        kubectl_create_secret(
            "quorumguard-webhook-tls",
            "quorumguard-system",
            Path::new("/tmp/qg/tls.crt"),
            Path::new("/tmp/my certs/tls.key"),
        ),
        "kubectl create secret tls quorumguard-webhook-tls -n quorumguard-system \
         --cert=/tmp/qg/tls.crt --key='/tmp/my certs/tls.key'"
    );
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(shell_quote(""), "''");
}
