//! The serving certificate's validity period: read from the leaf ([`Validity`]), judged against
//! the clock ([`ValidityProblem`]), described for an operator, and watched while it is served
//! ([`spawn_validity_watch`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config::{build, parse_chain};
use super::reload::{Snapshot, read_pair};
use super::{MIN_RELOAD_INTERVAL, TlsError};

/// How long before expiry the server starts warning: cert-manager renews at two thirds of the
/// lifetime (30 of 90 days left) and `quorumguard certs` is run by hand, so a week left means the
/// renewal has failed and someone has days, not minutes, to act.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

/// The validity period of the serving certificate (the first in the file), Unix seconds.
///
/// rustls serves whatever it is given; it is kube-apiserver that refuses an expired or
/// not-yet-valid certificate, and then every review fails and, with `failurePolicy: Fail`,
/// control-plane Machine deletions and KCP spec changes are refused. Refusing to serve would not
/// help (the webhook would be down all the same, and a renewed certificate could not be picked
/// up by the reloader), so the server keeps serving and says so loudly instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

/// What is wrong with a serving certificate's validity at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValidityProblem {
    /// Past `not_after`: kube-apiserver refuses it.
    Expired,
    /// Before `not_before` (clock skew, or issued for the future): kube-apiserver refuses it.
    NotYetValid,
    /// Valid, but for less than [`EXPIRY_WARNING`].
    ExpiresSoon,
}

impl Validity {
    /// Reads the validity of the first certificate in `cert_pem`; `path` names the file in errors.
    pub fn of_pem(cert_pem: &[u8], path: &Path) -> Result<Validity, TlsError> {
        let chain = parse_chain(cert_pem, path)?;
        let leaf = chain.first().ok_or_else(|| TlsError::NoCertificate {
            path: path.to_owned(),
            hint: "",
        })?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|e| TlsError::X509 {
                path: path.to_owned(),
                detail: e.to_string(),
            })?;
        Ok(Validity {
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
        })
    }

    /// The problem at `now` (Unix seconds), if any.
    pub fn problem(&self, now: i64) -> Option<ValidityProblem> {
        let warn = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
        if now > self.not_after {
            Some(ValidityProblem::Expired)
        } else if now < self.not_before {
            Some(ValidityProblem::NotYetValid)
        } else if self.not_after.saturating_sub(now) < warn {
            Some(ValidityProblem::ExpiresSoon)
        } else {
            None
        }
    }

    /// The message for an operator: what is wrong, what it breaks and what to do.
    pub fn describe(&self, problem: ValidityProblem, path: &Path, now: i64) -> String {
        use crate::certs::format_time;
        let consequence = "kube-apiserver refuses the webhook's TLS handshake, so every review \
             fails and, with failurePolicy Fail, control-plane Machine deletions and \
             KubeadmControlPlane spec changes are refused";
        let renew = "renew it: with cert-manager, `kubectl -n quorumguard-system describe \
             certificate quorumguard-webhook`; without, `quorumguard certs --out-dir DIR \
             --patch-webhook quorumguard` and update Secret quorumguard-webhook-tls (the new \
             pair is picked up without a restart)";
        let (cert, now_s) = (path.display(), format_time(now));
        match problem {
            ValidityProblem::Expired => format!(
                "serving certificate {cert} expired at {} (now {now_s}): {consequence}; {renew}",
                format_time(self.not_after)
            ),
            ValidityProblem::NotYetValid => format!(
                "serving certificate {cert} is not valid before {} (now {now_s}; is this node's \
                 clock or the issuer's wrong?): {consequence}; check the clocks, or {renew}",
                format_time(self.not_before)
            ),
            ValidityProblem::ExpiresSoon => format!(
                "serving certificate {cert} expires at {} (now {now_s}), in less than {} days: \
                 its renewal has not happened; once it expires {consequence}; {renew}",
                format_time(self.not_after),
                EXPIRY_WARNING.as_secs() / 86_400
            ),
        }
    }
}

/// Checks the validity of the pair the server would serve, every `interval` (at least
/// [`MIN_RELOAD_INTERVAL`]), and calls `report` with it when it or its problem changes (once at
/// start, then at expiry, at renewal, when the warning window opens...).
///
/// A certificate expires while it is served, with no file change for the reloader to notice, so
/// this is a clock-driven check of its own. Only a pair that builds (what [`spawn_reloader`]
/// would serve) is judged; an unreadable or rejected pair is the reloader's to report, and the
/// last good one's validity stands.
///
/// [`spawn_reloader`]: super::spawn_reloader
pub fn spawn_validity_watch(
    cert: PathBuf,
    key: PathBuf,
    interval: Duration,
    report: impl Fn(&Validity, Option<ValidityProblem>) + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let interval = interval.max(MIN_RELOAD_INTERVAL);
    tokio::spawn(async move {
        let mut last: Option<(Validity, Option<ValidityProblem>)> = None;
        // The pair last judged servable and its validity: an unchanged pair is not rebuilt, only
        // its validity judged again against the clock.
        let mut judged: Option<(Snapshot, Validity)> = None;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Ok(read) = read_pair(&cert, &key, None).await else {
                continue;
            };
            if !read.consistent {
                continue;
            }
            let validity = match &judged {
                Some((snapshot, validity)) if *snapshot == read.snapshot => *validity,
                _ => {
                    let snapshot = read.snapshot;
                    if build(&snapshot.cert, &snapshot.key, &cert, &key, None).is_err() {
                        continue;
                    }
                    let Ok(validity) = Validity::of_pem(&snapshot.cert, &cert) else {
                        continue;
                    };
                    judged = Some((snapshot, validity));
                    validity
                }
            };
            let now = crate::certs::unix_secs(std::time::SystemTime::now());
            let seen = (validity, validity.problem(now));
            if last != Some(seen) {
                report(&seen.0, seen.1);
                last = Some(seen);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    /// A self-signed pair valid from `not_before` to `not_after` (Unix seconds).
    fn valid_between(not_before: i64, not_after: i64) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.not_before =
            rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_before as u64);
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_after as u64);
        let cert = params.self_signed(&key).expect("self-signed");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn validity_is_read_from_the_leaf_and_judged_against_now() {
        const NOW: i64 = 1_796_256_000; // 2026-12-03T00:00:00Z
        const DAY: i64 = 86_400;
        let (leaf, _) = valid_between(NOW - DAY, NOW + 90 * DAY);
        let (other, _) = valid_between(NOW - 10 * DAY, NOW - 5 * DAY);
        let chain = format!("{leaf}{other}");
        let v = Validity::of_pem(chain.as_bytes(), Path::new("tls.crt")).expect("parses");
        assert_eq!(
            (v.not_before, v.not_after),
            (NOW - DAY, NOW + 90 * DAY),
            "the leaf's"
        );
        assert_eq!(v.problem(NOW), None);
        assert_eq!(v.problem(v.not_after - 8 * DAY), None);
        assert_eq!(
            v.problem(v.not_after - 6 * DAY),
            Some(ValidityProblem::ExpiresSoon)
        );
        assert_eq!(v.problem(v.not_after), Some(ValidityProblem::ExpiresSoon));
        assert_eq!(v.problem(v.not_after + 1), Some(ValidityProblem::Expired));
        assert_eq!(
            v.problem(v.not_before - 1),
            Some(ValidityProblem::NotYetValid)
        );

        let path = Path::new("/tls/tls.crt");
        let expired = v.describe(ValidityProblem::Expired, path, v.not_after + DAY);
        for part in [
            "/tls/tls.crt expired at 2027-03-03T00:00:00Z (now 2027-03-04T00:00:00Z)",
            "failurePolicy Fail",
            "quorumguard certs",
            "describe certificate quorumguard-webhook",
        ] {
            assert!(expired.contains(part), "{part:?} in {expired}");
        }
        let early = v.describe(ValidityProblem::NotYetValid, path, NOW - 2 * DAY);
        assert!(
            early.contains("not valid before 2026-12-02T00:00:00Z"),
            "{early}"
        );
        assert!(early.contains("clock"), "{early}");
        let soon = v.describe(ValidityProblem::ExpiresSoon, path, v.not_after - DAY);
        assert!(soon.contains("in less than 7 days"), "{soon}");

        let err = Validity::of_pem(b"", Path::new("tls.crt")).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let err = Validity::of_pem(garbage.as_bytes(), Path::new("tls.crt")).unwrap_err();
        assert!(matches!(err, TlsError::X509 { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("tls.crt: the serving certificate is not valid X.509")
        );
    }

    type Report = (Validity, Option<ValidityProblem>);

    async fn next_report(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Report>) -> Report {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a report within 5 s")
            .expect("the watch is running")
    }

    #[tokio::test]
    async fn the_validity_watch_reports_once_per_change_and_ignores_a_rejected_pair() {
        let dir = std::env::temp_dir().join(format!("qg-validity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let now = crate::certs::unix_secs(std::time::SystemTime::now());
        let (expired, expired_key) = valid_between(now - 10 * 86_400, now - 86_400);
        std::fs::write(&cert, &expired).expect("write");
        std::fs::write(&key, &expired_key).expect("write");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let watch = spawn_validity_watch(
            cert.clone(),
            key.clone(),
            MIN_RELOAD_INTERVAL,
            move |v, p| {
                let _ = tx.send((*v, p));
            },
        );
        let (v, p) = next_report(&mut rx).await;
        assert_eq!(
            (v.not_after, p),
            (now - 86_400, Some(ValidityProblem::Expired))
        );
        // A renewed certificate with the old key: rejected by the reloader, so not judged.
        let (renewed, renewed_key) = valid_between(now - 86_400, now + 90 * 86_400);
        std::fs::write(&cert, &renewed).expect("write");
        tokio::time::sleep(MIN_RELOAD_INTERVAL * 10).await;
        assert!(
            rx.try_recv().is_err(),
            "a pair that does not build is not reported"
        );
        std::fs::write(&key, &renewed_key).expect("write");
        let (v, p) = next_report(&mut rx).await;
        assert_eq!((v.not_after, p), (now + 90 * 86_400, None));
        tokio::time::sleep(MIN_RELOAD_INTERVAL * 10).await;
        assert!(rx.try_recv().is_err(), "no change, no report");
        watch.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
