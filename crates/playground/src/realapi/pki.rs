//! The real API server's certificates: a CA made for the run that signs kube-apiserver's serving
//! certificate, its admin client certificate (`system:masters`) and any other loopback server's.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};

use super::RealApiError;

/// A certificate and its key, both PEM.
pub type Pair = (String, String);

/// A CA that signs the API server's serving certificate and its clients' certificates.
pub(crate) struct Ca {
    pub(crate) pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn certs_err(e: rcgen::Error) -> RealApiError {
    RealApiError::Certs(e.to_string())
}

impl Ca {
    pub(crate) fn new() -> Result<Ca, RealApiError> {
        let key = KeyPair::generate().map_err(certs_err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(certs_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "envtest-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).map_err(certs_err)?;
        Ok(Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A certificate and its key (PEM): for a client (CN = user, O = groups) or a server.
    pub(crate) fn sign(
        &self,
        cn: &str,
        groups: &[&str],
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<Pair, RealApiError> {
        let key = KeyPair::generate().map_err(certs_err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(certs_err)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![usage];
        let now = std::time::SystemTime::now();
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + Duration::from_secs(2 * 86_400)).into();
        let cert = params.signed_by(&key, &self.issuer).map_err(certs_err)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A serving certificate for 127.0.0.1 and `localhost` (plus `dns`).
    pub(crate) fn loopback_server(&self, cn: &str, dns: &[&str]) -> Result<Pair, RealApiError> {
        let mut sans = vec![SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())];
        for name in std::iter::once(&"localhost").chain(dns) {
            let name = (*name).try_into().map_err(certs_err)?;
            sans.push(SanType::DnsName(name));
        }
        self.sign(cn, &[], sans, ExtendedKeyUsagePurpose::ServerAuth)
    }
}
