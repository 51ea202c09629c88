//! The unit tests of [`crate::certs`], and the helpers other modules' certificate tests share.

use super::testkit::*;
use super::*;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Asserts that `$result` is an error matching `$pattern`, and returns it.
macro_rules! refused {
    ($result:expr, $pattern:pat $(if $guard:expr)?) => {{
        let err = $result.unwrap_err();
        assert!(matches!(err, $pattern $(if $guard)?), "{err}");
        err
    }};
}

/// Runs `openssl <args>` (split at spaces) in `dir`: whether it succeeded, and its output.
fn openssl(dir: &Path, args: &str) -> (bool, String) {
    let out = std::process::Command::new("openssl")
        .args(args.split(' '))
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the openssl command is needed (apt-get install openssl)");
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text.into_owned())
}

fn self_signed(params: &mut CertificateParams, key: &KeyPair) -> String {
    set_validity(params, NOW - DAY, NOW + 1000 * DAY);
    params.self_signed(key).unwrap().pem()
}

fn ca_params(key_usages: Vec<KeyUsagePurpose>) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = key_usages;
    params
}

#[test]
fn a_new_ca_and_its_serving_certificates_have_exact_validity_and_usages() {
    let ca = Ca::generate(NOW).unwrap();
    let ca_facts = facts(ca.cert_pem());
    assert_eq!(ca_facts.ca, Some(true));
    assert_eq!(ca_facts.key_cert_sign, Some(true));
    assert_eq!(ca_facts.not_before, NOW - BACKDATE_SECS);
    assert_eq!(ca_facts.not_after, NOW + 3650 * DAY);
    assert_eq!(ca_facts.issuer, ca_facts.subject, "self-signed");
    assert_eq!(ca.not_after(), NOW + 3650 * DAY);

    let names = ["a.b.svc".to_string(), "10.0.0.7".to_string()];
    let leaf = ca.issue("a.b.svc", &names, 365, NOW).unwrap();
    let leaf_facts = facts(&leaf.cert_pem);
    assert_eq!(leaf_facts.ca, Some(false));
    assert_eq!(leaf_facts.key_cert_sign, Some(false));
    assert_eq!(leaf_facts.eku, Some((true, false)), "serverAuth only");
    assert_eq!(leaf_facts.not_before, NOW - BACKDATE_SECS);
    assert_eq!(leaf_facts.not_after, NOW + 365 * DAY);
    assert_eq!(leaf.not_after, NOW + 365 * DAY);
    assert_eq!(leaf_facts.issuer, ca_facts.subject);
    assert_eq!(leaf_facts.cn, "a.b.svc");
    assert_ne!(leaf_facts.public_key, ca_facts.public_key);
    // Both keys are PKCS#8 and usable.
    let key = |pem: &str| KeyPair::from_pem(pem).unwrap().der_bytes().to_vec();
    assert_eq!(key(ca.key_pem()), ca_facts.public_key);
    assert_eq!(key(&leaf.key_pem), leaf_facts.public_key);
}

#[test]
fn a_foreign_ca_subject_with_other_string_types_is_reproduced_exactly() {
    use rcgen::DnValue::{Ia5String, PrintableString};
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = ca_params(vec![KeyUsagePurpose::KeyCertSign]);
    let dn = &mut params.distinguished_name;
    *dn = DistinguishedName::new();
    dn.push(
        DnType::CountryName,
        PrintableString("DE".try_into().unwrap()),
    );
    dn.push(DnType::OrganizationName, "Kräftig GmbH");
    let email = DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]);
    dn.push(email, Ia5String("ops@example.com".try_into().unwrap()));
    dn.push(DnType::CommonName, "Platform CA");
    let cert = self_signed(&mut params, &key);
    let ca = Ca::from_pem(&cert, &key.serialize_pem()).unwrap();
    let leaf = ca.issue("a.b.svc", &["a.b.svc".to_string()], 30, NOW);
    assert_eq!(facts(&leaf.unwrap().cert_pem).issuer, facts(&cert).subject);
    let client = ca.sign_client("x", Duration::from_secs(60), NOW).unwrap();
    assert_eq!(facts(&client.cert_pem).issuer, facts(&cert).subject);
}

#[test]
fn a_ca_without_key_usage_or_with_an_empty_key_id_is_still_usable() {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = ca_params(vec![]);
    params.key_identifier_method = rcgen::KeyIdMethod::PreSpecified(vec![]);
    let ca = Ca::from_pem(&self_signed(&mut params, &key), &key.serialize_pem()).unwrap();
    ca.issue("x", &["x".to_string()], 30, NOW).unwrap();
}

#[test]
fn a_wrong_or_unusable_ca_is_refused_with_the_reason() {
    let (a, b) = (Ca::generate(NOW).unwrap(), Ca::generate(NOW).unwrap());
    let (a_cert, a_key) = (a.cert_pem(), a.key_pem());
    refused!(Ca::from_pem(a_cert, b.key_pem()), CertError::CaKeyMismatch);

    // A serving certificate is not a CA, nor is a self-signed certificate without
    // basicConstraints; a CA whose keyUsage lacks keyCertSign may not sign certificates.
    let leaf = a.issue("x", &["x".to_string()], 30, NOW).unwrap();
    refused!(
        Ca::from_pem(&leaf.cert_pem, &leaf.key_pem),
        CertError::NotCa(_)
    );
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut plain = CertificateParams::new(vec!["x".to_string()]).unwrap();
    let plain = self_signed(&mut plain, &key);
    refused!(
        Ca::from_pem(&plain, &key.serialize_pem()),
        CertError::NotCa("missing")
    );
    let signer = self_signed(
        &mut ca_params(vec![KeyUsagePurpose::DigitalSignature]),
        &key,
    );
    refused!(
        Ca::from_pem(&signer, &key.serialize_pem()),
        CertError::NotCertSigner
    );

    // Expired, not yet valid, or expiring before the serving certificate.
    let names = ["x".to_string()];
    let expired = a.issue("x", &names, 1, NOW + 3651 * DAY);
    refused!(expired, CertError::CaValidity(ref m) if m.contains("expired"));
    let early = a.issue("x", &names, 1, NOW - 2 * DAY);
    refused!(early, CertError::CaValidity(ref m) if m.contains("before"));
    let err = refused!(
        a.issue("x", &names, 365, NOW + 3600 * DAY),
        CertError::CaExpiresFirst { .. }
    );
    assert!(err.to_string().contains("--days"), "{err}");

    // Encrypted, broken or missing keys.
    for label in ["EC PRIVATE KEY", "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY"] {
        let key = format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
        refused!(Ca::from_pem(a_cert, &key), CertError::CaKey(_));
    }
    for key in ["garbage", a_cert] {
        refused!(Ca::from_pem(a_cert, key), CertError::CaKey(_));
    }

    // Not a certificate at all, or a broken one.
    refused!(Ca::from_pem(a_key, a_key), CertError::CaCertPem(_));
    let mut der = CertificateDer::from_pem_slice(a_cert.as_bytes())
        .unwrap()
        .to_vec();
    der.truncate(der.len() / 2);
    let truncated = certificate_pem(&der).unwrap();
    refused!(Ca::from_pem(&truncated, a_key), CertError::CaCertDer(_));
}

#[test]
fn the_ca_pem_is_cleaned_of_surrounding_text() {
    let a = Ca::generate(NOW).unwrap();
    let noisy = format!("Certificate:\n  Data: ...\n{}{}", a.cert_pem(), a.key_pem());
    let ca = Ca::from_pem(&noisy, a.key_pem()).unwrap();
    assert_eq!(ca.cert_pem(), a.cert_pem());
}

#[test]
fn a_broken_clock_is_refused() {
    let ca = Ca::generate(NOW).unwrap();
    for now in [0, MIN_NOW - 1, MAX_NOW + 1] {
        refused!(Ca::generate(now), CertError::Clock(n) if n == now);
        refused!(ca.issue("x", &[], 1, now), CertError::Clock(n) if n == now);
        let client = ca.sign_client("x", Duration::from_secs(60), now);
        refused!(client, CertError::Clock(n) if n == now);
    }
}

#[test]
fn a_client_certificate_is_for_client_auth_and_verifies() {
    let ca = Ca::generate(NOW).unwrap();
    let week = Duration::from_secs(7 * 86_400);
    let client = ca.sign_client("quorumguard", week, NOW).unwrap();
    let c = facts(&client.cert_pem);
    assert_eq!(c.cn, "quorumguard");
    assert_eq!(c.issuer, facts(ca.cert_pem()).subject);
    assert_eq!((c.ca, c.eku), (Some(false), Some((false, true))));
    assert_eq!(
        (c.not_before, c.not_after),
        (NOW - CLIENT_BACKDATE_SECS, NOW + 7 * DAY)
    );
    assert_eq!(
        (client.not_before, client.not_after),
        (c.not_before, c.not_after)
    );
    let key = KeyPair::from_pem(&client.key_pem).unwrap();
    assert_eq!(key.der_bytes(), c.public_key);

    let tmp = TempDir::new("client");
    std::fs::create_dir_all(&tmp.0).unwrap();
    std::fs::write(tmp.0.join("ca.crt"), ca.cert_pem()).unwrap();
    std::fs::write(tmp.0.join("client.crt"), &client.cert_pem).unwrap();
    let verify = |purpose| {
        let args = format!("verify -attime {NOW} -CAfile ca.crt -purpose {purpose} client.crt");
        openssl(&tmp.0, &args)
    };
    let (ok, out) = verify("sslclient");
    assert!(ok && out.contains("client.crt: OK"), "{out}");
    assert!(!verify("sslserver").0, "not a serving certificate");

    // Never valid past the CA; refused once the CA has expired; the name is checked.
    let long = ca.sign_client("x", Duration::MAX, NOW).unwrap();
    assert_eq!(long.not_after, ca.not_after());
    refused!(
        ca.sign_client("x", week, ca.not_after()),
        CertError::CaValidity(_)
    );
    for cn in ["", &"n".repeat(65), "a\nb"] {
        refused!(ca.sign_client(cn, week, NOW), CertError::InvalidName { .. });
    }
}

/// The etcd prober's case: a CA made elsewhere, its key in any of the usual formats
/// (Cluster API writes PKCS#1 RSA).
#[test]
fn client_certificates_verify_with_openssl_cas_of_every_key_format() {
    let tmp = TempDir::new("openssl-ca");
    std::fs::create_dir_all(&tmp.0).unwrap();
    let no_key_ids = " -addext subjectKeyIdentifier=none -addext authorityKeyIdentifier=none";
    for keygen in [
        "genrsa -traditional -out pkcs1.key 2048",
        "ecparam -name prime256v1 -genkey -noout -out sec1.key",
        "genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out p384.key",
        "genpkey -algorithm ed25519 -out ed25519.key",
        "genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out noskid.key",
    ] {
        let name = keygen
            .split(' ')
            .find_map(|w| w.strip_suffix(".key"))
            .unwrap();
        let extra = if name == "noskid" { no_key_ids } else { "" };
        let ok = |(ok, out): (bool, String)| assert!(ok, "{name}: {out}");
        ok(openssl(&tmp.0, keygen));
        let req = format!(
            "req -x509 -key {name}.key -days 9 -subj /C=DE/O=Example/CN=etcd-ca \
             -addext basicConstraints=critical,CA:TRUE -out {name}.crt{extra}"
        );
        ok(openssl(&tmp.0, &req));
        let read = |ext: &str| std::fs::read_to_string(tmp.0.join(format!("{name}.{ext}")));
        let (cert_pem, key_pem) = (read("crt").unwrap(), read("key").unwrap());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();

        let ca = Ca::from_pem(&cert_pem, &key_pem).unwrap();
        let client = ca.sign_client("quorumguard", Duration::from_secs(60), now as i64);
        std::fs::write(tmp.0.join("client.crt"), client.unwrap().cert_pem).unwrap();
        let verify = format!("verify -purpose sslclient -CAfile {name}.crt client.crt");
        let (ok, out) = openssl(&tmp.0, &verify);
        assert!(ok && out.contains("client.crt: OK"), "{name}: {out}");
    }
}

/// rcgen keeps one value per attribute type and one attribute per RDN: such a subject
/// cannot be reproduced as an issuer name, which is found out before anything is issued.
#[test]
fn a_subject_that_cannot_be_reproduced_is_refused() {
    let tmp = TempDir::new("subjects");
    std::fs::create_dir_all(&tmp.0).unwrap();
    for (name, subject) in [("repeated", "/O=A/O=B/CN=x"), ("multi", "/O=A+CN=x")] {
        let req = format!(
            "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {name}.key \
             -days 9 -multivalue-rdn -subj {subject} -out {name}.crt \
             -addext basicConstraints=critical,CA:TRUE"
        );
        let (ok, out) = openssl(&tmp.0, &req);
        assert!(ok, "{out}");
        let read = |ext: &str| std::fs::read_to_string(tmp.0.join(format!("{name}.{ext}")));
        let ca = Ca::from_pem(&read("crt").unwrap(), &read("key").unwrap());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let client = ca.and_then(|ca| ca.sign_client("x", Duration::from_secs(60), now as i64));
        refused!(client, CertError::CaSubject(_));
    }
}

#[test]
fn ca_bundle_is_kubernetes_base64_of_the_pem() {
    let ca = Ca::generate(NOW).unwrap();
    let b64 = ca_bundle(ca.cert_pem()).unwrap();
    assert!(!b64.contains('\n'));
    let decoded: ByteString = serde_json::from_value(Value::String(b64)).unwrap();
    assert_eq!(decoded.0, ca.cert_pem().as_bytes());
    assert_eq!(ca_bundle("hi\n").unwrap(), "aGkK");
}

#[test]
fn debug_output_never_shows_a_key() {
    let ca = Ca::generate(NOW).unwrap();
    let leaf = ca.issue("x", &["x".to_string()], 1, NOW).unwrap();
    let client = ca.sign_client("x", Duration::from_secs(60), NOW).unwrap();
    for shown in [format!("{ca:?}"), format!("{leaf:?} {client:?}")] {
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    }
}

#[test]
fn times_are_rfc_3339_in_utc() {
    assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
    assert_eq!(format_time(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(format_time(NOW), "2026-08-01T00:00:00Z");
    assert_eq!(format_time(4_102_444_799), "2099-12-31T23:59:59Z");
    assert_eq!(format_time(-1), "1969-12-31T23:59:59Z");
    assert!(format_time(i64::MAX).ends_with("(Unix seconds)"));
}

#[test]
fn a_ca_can_be_shared_between_tasks() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Ca>();
}
