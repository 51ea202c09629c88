//! The server configuration built from a certificate/key pair in PEM: the chain and key parsed,
//! the key matched against the serving certificate, on the `ring` provider.

use std::path::Path;
use std::sync::Arc;

use rustls::{
    InconsistentKeys, ServerConfig,
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    sign::{CertifiedKey, SingleCertAndKey},
    version::{TLS12, TLS13},
};

use super::client_auth::{self, ClientAuth};
use super::{ALPN_PROTOCOLS, TlsError};

/// Builds the server configuration from PEM contents: TLS 1.3 and 1.2 only, the `ring` provider,
/// ALPN `h2` then `http/1.1`.
///
/// `cert_pem` may hold a chain (serving certificate first, then intermediates), as cert-manager
/// writes `tls.crt`; `key_pem` may be PKCS#8, PKCS#1 (RSA) or SEC1 (EC), the first key block is
/// used. The key is checked against the serving certificate, so a mismatched pair fails here and
/// not at the first handshake. Errors name the inputs `<certificate PEM>` and `<key PEM>`; use
/// [`load`] to have them name the files.
///
/// [`load`]: super::load
pub fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerConfig, TlsError> {
    build(
        cert_pem,
        key_pem,
        Path::new("<certificate PEM>"),
        Path::new("<key PEM>"),
        None,
    )
}

/// [`server_config`] with the names errors should use for the two inputs, and, when `client` is
/// given (the CA file's contents and what it is for), a client certificate required and verified
/// in every handshake.
pub(super) fn build(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
    client: Option<(&[u8], &ClientAuth)>,
) -> Result<ServerConfig, TlsError> {
    let chain = parse_chain(cert_pem, cert_path)?;
    let key = parse_key(key_pem, key_path)?;
    let provider = Arc::new(ring::default_provider());
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::InvalidKey {
            path: key_path.to_owned(),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // `Unknown`: the key cannot tell its public half. Every ring key can, so this is not
        // reached; rustls itself accepts such keys, and so do we.
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(TlsError::KeyMismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            });
        }
        Err(source) => {
            return Err(TlsError::InvalidCertificate {
                path: cert_path.to_owned(),
                source,
            });
        }
    }
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&TLS13, &TLS12])
        .map_err(TlsError::Config)?;
    let builder = match client {
        Some((ca_pem, auth)) => {
            builder.with_client_cert_verifier(client_auth::verifier(ca_pem, auth, provider)?)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// All `CERTIFICATE` blocks, in file order (other blocks are skipped).
pub(super) fn parse_chain(
    pem: &[u8],
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        let hint = if is_blank(pem) {
            " (the file is empty)"
        } else if contains(pem, b"PRIVATE KEY-----") {
            " (the file holds a private key: are the certificate and key files swapped?)"
        } else {
            ""
        };
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
            hint,
        });
    }
    Ok(chain)
}

/// The first private key block (PKCS#8, PKCS#1 or SEC1).
fn parse_key(pem: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    // `ENCRYPTED PRIVATE KEY` (PKCS#8) and OpenSSL's `Proc-Type: 4,ENCRYPTED` header.
    if contains(pem, b"ENCRYPTED") {
        return Err(TlsError::EncryptedKey {
            path: path.to_owned(),
        });
    }
    match PrivateKeyDer::pem_slice_iter(pem).next() {
        Some(Ok(key)) => Ok(key),
        Some(Err(source)) => Err(TlsError::Pem {
            path: path.to_owned(),
            source,
        }),
        None => {
            let hint = if is_blank(pem) {
                " (the file is empty)"
            } else if contains(pem, b"CERTIFICATE-----") {
                " (the file holds a certificate: are the certificate and key files swapped?)"
            } else {
                ""
            };
            Err(TlsError::NoKey {
                path: path.to_owned(),
                hint,
            })
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::fixtures::generated;
    use rcgen::{CertificateParams, KeyPair};

    // Test-only keys, made with OpenSSL 3 (`genrsa -traditional`, `ecparam -genkey -noout`,
    // `pkey`): PKCS#1 and SEC1 are what cert-manager writes by default, and ring cannot generate
    // RSA keys, so they are fixed here rather than generated.
    const RSA_PKCS1: &str = "-----BEGIN RSA PRIVATE KEY-----
MIIEpAIBAAKCAQEAtauvsUx9AK2/4fUbgTxeFQ+3jZ9YEhBjLI6lTWSO1+p/eFC+
ODPpRcplGYfEjgE1w+84UMRZoyDGhAuhECSNk6JzH189DFZqcMF+WjVwrvRj8DU4
5oprhxx2XG/qPnq16dmyobmf5tSdRICRupS1/LZF/PUGsYVGuHXCB+Y8aCtQc+Yx
qoNSc/l+A/45OBUabQPqwddjjfXZfDpHY4w4PcUCmGi+Ifda6eIc01EN7hVqO5tq
llcKc7CKJbJx8yxJhFSklw3HnneY6eaCbOkTM40tB2z5Nw4xAM+vgvXcVJGB8uzg
B/sJwDzSRMimZyYX0kcTAKGMV4FPMl2wIpKX2QIDAQABAoIBAEgptQXf5K2O1vAa
DT1mLdb+4cILQBAY21QZK3dVENqahtzTcePgVvKGhWdBQ2XG/ETissN+Yz7Fp6VO
+0DuzCAPQNx+18CdWPWGHrsVjDeq00HY2kvVQwYt26Q3PlxoIPeNpoPQOMCXxwqt
aXWsWafS/XUQHYMJdkCSYisCHQ+hLaDAsgW9A1hs4WEfIvA20zl23EW5aCX7P1LT
prHlIczjz3EVAGqRr7Bki8tpbdJEMpGveHo6M5pjolxH7B8v+hfR8el7vs6e0tjV
mvifKbxF3sJeZC2K2HFkdsS5/NkiCzhVSkbrBvHLvCM3YjdG6e562QtVOFz5TXAv
+g/FMRMCgYEA2t7J0BPzyZX3eV5eGXDfT6OnJUZD2vBNHQDl9RiOuZxmSNLVyCNC
swI4I0n+OjzYYddYU2wm+HVZ5qeLmuBAZQvCjKmlJdZDhffuc/w8esKiXokjDcws
7MOZAqxEK14Ngq2vt+Rw8bWV6tABopp5k6cymNy8eZe8u6y2362KA9sCgYEA1H1f
qCgU8eS6I7PJPSnIO9LvUDQIf7UdKUhqMRakL79w3aqa8i8CNAMZHsDKC6KgBucp
A6/XyxrwGTg9cbhbBGsUB+nkPaFiCazbaEj0M791j+S9yV+SHm408BmzE7zstud/
XLfraUGclYpjGTsXldc9GHu360x0Uq6/h3zLe1sCgYEAx57c2A/qkJhb3vFHx9Jf
iiZL4z5D0yLKYkKYecONIRLZY2AQJXqrcdL7Wow49+rYu9wJrgR9Qqzdcvaq6HXR
pZdlOJ/dhTX33e80J8sNajWsm6ZeN05aRxNascpmXlto3SAGnSUYMgwZENHoO+LC
Mf4TssHYkNnpBA7RuA5yS3MCgYAgSjkKDaU5KP/cQwrWn43NAX3aWz3bYkNfLaDt
erpSgy38kVtgaCJWkw3zLWrGn9zfj6sc41DQjXRk8LXtnQ0/u6Hcnf9QGkESpVDm
JQfvAS41QpZQjpReyXKD9fPPkQsLtFwXU9+TLCRGWTQ79k3cOEwRd2N4fzLCCcoT
JbSqNwKBgQCnVub3w18EOJ11OWJY6bobfWuAG5pK3hE29/hAqwu3itbjqKOYxuJM
i+rVfsYlJbUyhqT5aejqY8pe0pbAJ5fhI5pIuGJQS6M0il/HrxYZ0Cy0DBqnMm+E
Kw8AAEEWRz8EF7E7ib2uTNckZ3atswF19Ho8Lqabryv0LB9+zrAUDQ==
-----END RSA PRIVATE KEY-----
";
    const RSA_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQC1q6+xTH0Arb/h
9RuBPF4VD7eNn1gSEGMsjqVNZI7X6n94UL44M+lFymUZh8SOATXD7zhQxFmjIMaE
C6EQJI2TonMfXz0MVmpwwX5aNXCu9GPwNTjmimuHHHZcb+o+erXp2bKhuZ/m1J1E
gJG6lLX8tkX89QaxhUa4dcIH5jxoK1Bz5jGqg1Jz+X4D/jk4FRptA+rB12ON9dl8
OkdjjDg9xQKYaL4h91rp4hzTUQ3uFWo7m2qWVwpzsIolsnHzLEmEVKSXDceed5jp
5oJs6RMzjS0HbPk3DjEAz6+C9dxUkYHy7OAH+wnAPNJEyKZnJhfSRxMAoYxXgU8y
XbAikpfZAgMBAAECggEASCm1Bd/krY7W8BoNPWYt1v7hwgtAEBjbVBkrd1UQ2pqG
3NNx4+BW8oaFZ0FDZcb8ROKyw35jPsWnpU77QO7MIA9A3H7XwJ1Y9YYeuxWMN6rT
QdjaS9VDBi3bpDc+XGgg942mg9A4wJfHCq1pdaxZp9L9dRAdgwl2QJJiKwIdD6Et
oMCyBb0DWGzhYR8i8DbTOXbcRbloJfs/UtOmseUhzOPPcRUAapGvsGSLy2lt0kQy
ka94ejozmmOiXEfsHy/6F9Hx6Xu+zp7S2NWa+J8pvEXewl5kLYrYcWR2xLn82SIL
OFVKRusG8cu8IzdiN0bp7nrZC1U4XPlNcC/6D8UxEwKBgQDa3snQE/PJlfd5Xl4Z
cN9Po6clRkPa8E0dAOX1GI65nGZI0tXII0KzAjgjSf46PNhh11hTbCb4dVnmp4ua
4EBlC8KMqaUl1kOF9+5z/Dx6wqJeiSMNzCzsw5kCrEQrXg2Cra+35HDxtZXq0AGi
mnmTpzKY3Lx5l7y7rLbfrYoD2wKBgQDUfV+oKBTx5Lojs8k9Kcg70u9QNAh/tR0p
SGoxFqQvv3DdqpryLwI0AxkewMoLoqAG5ykDr9fLGvAZOD1xuFsEaxQH6eQ9oWIJ
rNtoSPQzv3WP5L3JX5IebjTwGbMTvOy2539ct+tpQZyVimMZOxeV1z0Ye7frTHRS
rr+HfMt7WwKBgQDHntzYD+qQmFve8UfH0l+KJkvjPkPTIspiQph5w40hEtljYBAl
eqtx0vtajDj36ti73AmuBH1CrN1y9qroddGll2U4n92FNffd7zQnyw1qNaybpl43
TlpHE1qxymZeW2jdIAadJRgyDBkQ0eg74sIx/hOywdiQ2ekEDtG4DnJLcwKBgCBK
OQoNpTko/9xDCtafjc0BfdpbPdtiQ18toO16ulKDLfyRW2BoIlaTDfMtasaf3N+P
qxzjUNCNdGTwte2dDT+7odyd/1AaQRKlUOYlB+8BLjVCllCOlF7JcoP188+RCwu0
XBdT35MsJEZZNDv2Tdw4TBF3Y3h/MsIJyhMltKo3AoGBAKdW5vfDXwQ4nXU5Yljp
uht9a4AbmkreETb3+ECrC7eK1uOoo5jG4kyL6tV+xiUltTKGpPlp6Opjyl7SlsAn
l+Ejmki4YlBLozSKX8evFhnQLLQMGqcyb4QrDwAAQRZHPwQXsTuJva5M1yRndq2z
AXX0ejwuppuvK/QsH37OsBQN
-----END PRIVATE KEY-----
";
    const EC_SEC1: &str = "-----BEGIN EC PRIVATE KEY-----
MHcCAQEEII7ooZ7WHSK+wvhh6MSHZdxvlxR4yMsDF9cv3oJQs8GioAoGCCqGSM49
AwEHoUQDQgAE/Fvw7xxmAlhXVPOQG0IlBNVZtsNcnUykBVsgvlhgutUhWfHW9hnw
opkVWyNkuEIHzqeFnyWw6iDMQPQ0fe9kTw==
-----END EC PRIVATE KEY-----
";
    const EC_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgjuihntYdIr7C+GHo
xIdl3G+XFHjIywMX1y/eglCzwaKhRANCAAT8W/DvHGYCWFdU85AbQiUE1Vm2w1yd
TKQFWyC+WGC61SFZ8db2GfCimRVbI2S4QgfOp4WfJbDqIMxA9DR972RP
-----END PRIVATE KEY-----
";

    /// A self-signed certificate for the PKCS#8 key `key_pem`.
    fn cert_for(key_pem: &str) -> String {
        let key = KeyPair::from_pem(key_pem).expect("test key parses");
        CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("self-signed")
            .pem()
    }

    #[test]
    fn accepts_pkcs8_pkcs1_and_sec1_keys() {
        let rsa_cert = cert_for(RSA_PKCS8);
        let ec_cert = cert_for(EC_PKCS8);
        for (cert, key, what) in [
            (&rsa_cert, RSA_PKCS8, "RSA PKCS#8"),
            (&rsa_cert, RSA_PKCS1, "RSA PKCS#1"),
            (&ec_cert, EC_PKCS8, "EC PKCS#8"),
            (&ec_cert, EC_SEC1, "EC SEC1"),
        ] {
            let config = server_config(cert.as_bytes(), key.as_bytes())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                config.alpn_protocols,
                vec![b"h2".to_vec(), b"http/1.1".to_vec()],
                "{what}"
            );
        }
    }

    #[test]
    fn a_chain_is_accepted_and_the_key_matched_against_its_first_certificate() {
        let (leaf, key) = generated();
        let (other, _) = generated();
        let chain = format!("{leaf}{other}");
        server_config(chain.as_bytes(), key.as_bytes()).expect("leaf first");
        let reversed = format!("{other}{leaf}");
        let err = server_config(reversed.as_bytes(), key.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    }

    #[test]
    fn a_key_that_does_not_match_is_refused_naming_both_files() {
        let (cert, _) = generated();
        let (_, other_key) = generated();
        let err = build(
            cert.as_bytes(),
            other_key.as_bytes(),
            Path::new("/certs/tls.crt"),
            Path::new("/certs/tls.key"),
            None,
        )
        .unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("/certs/tls.key does not match"),
            "{message}"
        );
        assert!(message.contains("/certs/tls.crt"), "{message}");
    }

    #[test]
    fn missing_certificate_or_key_is_named_with_a_hint() {
        let (cert, key) = generated();
        let (crt, tls_key) = (Path::new("/s/tls.crt"), Path::new("/s/tls.key"));

        let err = build(b"", key.as_bytes(), crt, tls_key, None).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        assert!(
            err.to_string().starts_with("/s/tls.crt: no certificate"),
            "{err}"
        );
        assert!(err.to_string().contains("empty"), "{err}");

        // The two files swapped.
        let err = build(key.as_bytes(), cert.as_bytes(), crt, tls_key, None).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        assert!(err.to_string().contains("swapped"), "{err}");

        let err = build(cert.as_bytes(), cert.as_bytes(), crt, tls_key, None).unwrap_err();
        assert!(matches!(err, TlsError::NoKey { .. }), "{err}");
        assert!(
            err.to_string().starts_with("/s/tls.key: no private key"),
            "{err}"
        );
        assert!(err.to_string().contains("swapped"), "{err}");
    }

    #[test]
    fn encrypted_truncated_and_garbage_inputs_are_explained() {
        let (cert, key) = generated();

        let encrypted =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let err = server_config(cert.as_bytes(), encrypted.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::EncryptedKey { .. }), "{err}");

        // Half-written: the end marker never arrived.
        let truncated = &cert[..cert.len() / 2];
        let err = server_config(truncated.as_bytes(), key.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::Pem { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("<certificate PEM>: malformed PEM"),
            "{err}"
        );

        let garbage = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        let err = server_config(garbage.as_bytes(), key.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::InvalidCertificate { .. }), "{err}");

        let bad_key = "-----BEGIN PRIVATE KEY-----\naGVsbG8=\n-----END PRIVATE KEY-----\n";
        let err = server_config(cert.as_bytes(), bad_key.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::InvalidKey { .. }), "{err}");
    }
}
