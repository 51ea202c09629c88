//! `quorumguard certs`: the webhook's serving certificate on clusters without cert-manager.
//!
//! Makes a CA (or reuses one), issues a serving certificate for the webhook Service's DNS names,
//! writes `ca.crt`, `ca.key` (new CA only), `tls.crt` (chain) and `tls.key`, and tells how to
//! install them. Optionally prints the caBundle or patches it into the
//! ValidatingWebhookConfiguration. The CA and the certificates come from [`quorumguard_pki::certs`]; this
//! is what the command adds: the Service's names, the files, the printed commands and the patch.
//!
//! With `--client NAME` it issues kube-apiserver's client certificate instead, for `serve
//! --client-ca-file/--client-name`: a client CA (made or reused) and a clientAuth certificate
//! for `CN=NAME`, written as `client-ca.crt`, `client-ca.key` (new CA only), `client.crt` and
//! `client.key`.

//!
//! This file holds the arguments and `run`, which prints what to do next; its children:
//! - `bundle`: the Service's DNS names, the CA made or reused, the serving certificate, and
//!   the client certificate;
//! - `files`: writing the files with their modes, never overwriting without `--force`;
//! - `webhook`: `--patch-webhook`, the caBundle patched into the ValidatingWebhookConfiguration.

mod bundle;
mod files;
#[cfg(test)]
mod tests;
mod webhook;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use clap::Args;

use quorumguard_pki::certs::{CertError, MAX_DAYS, format_time};

use bundle::{ClientRequest, Request, generate, generate_client};
use files::write_files;
use webhook::WebhookTarget;

/// The webhook Service the API server dials (`clientConfig.service.name`).
const DEFAULT_SERVICE: &str = "quorumguard-webhook";
/// The namespace quorumguard runs in.
const DEFAULT_NAMESPACE: &str = "quorumguard-system";
/// The Secret the Deployment mounts at /tls.
const DEFAULT_SECRET: &str = "quorumguard-webhook-tls";
/// The ValidatingWebhookConfiguration the manifests install.
const DEFAULT_WEBHOOK_CONFIGURATION: &str = "quorumguard";
/// Validity of a serving certificate unless `--days` says otherwise.
const DEFAULT_DAYS: u32 = 365;
/// File names in the output directory. `tls.crt`/`tls.key` are what `kubectl create secret tls`
/// and the Deployment's volume expect.
const CA_CERT_FILE: &str = "ca.crt";
const CA_KEY_FILE: &str = "ca.key";
const CERT_FILE: &str = "tls.crt";
const KEY_FILE: &str = "tls.key";
/// File names with `--client`: `client-ca.crt` is what `serve --client-ca-file` reads (as the
/// `ca.crt` of Secret quorumguard-client-ca); `client.crt`/`client.key` go to kube-apiserver.
const CLIENT_CA_CERT_FILE: &str = "client-ca.crt";
const CLIENT_CA_KEY_FILE: &str = "client-ca.key";
const CLIENT_CERT_FILE: &str = "client.crt";
const CLIENT_KEY_FILE: &str = "client.key";
/// The Secret the client-auth Deployment patch mounts at /client-ca.
const CLIENT_CA_SECRET: &str = "quorumguard-client-ca";

#[derive(Debug, Args)]
#[command(after_help = "\
Files written to --out-dir:
  ca.crt   the CA certificate; its base64 is the webhook's caBundle
  ca.key   the CA key (0600), only when a new CA is made; keep it to renew with --ca-cert/--ca-key
  tls.crt  the serving certificate followed by the CA certificate (a chain)
  tls.key  the serving key (0600)

Output: stdout carries only the caBundle (with --print-ca-bundle), so
`CA_BUNDLE=$(quorumguard certs ... --print-ca-bundle)` works; everything else goes to stderr.

Install without cert-manager:
  kubectl apply -k manifests/no-cert-manager/
  quorumguard certs --out-dir ./qg-certs --patch-webhook quorumguard
  kubectl create secret tls quorumguard-webhook-tls -n quorumguard-system \\
    --cert=./qg-certs/tls.crt --key=./qg-certs/tls.key

Renew with the same CA (the caBundle stays; then replace the Secret):
  quorumguard certs --out-dir ./qg-certs --ca-cert ./qg-certs/ca.crt --ca-key ./qg-certs/ca.key \\
    --force

kube-apiserver's client certificate (for serve --client-ca-file/--client-name), with --client NAME:
  quorumguard certs --out-dir ./qg-client --client kube-apiserver
  client-ca.crt  the client CA certificate: serve's --client-ca-file (Secret quorumguard-client-ca)
  client-ca.key  the client CA key (0600), only when a new CA is made; keep it offline
  client.crt     the client certificate (CN=NAME, clientAuth) followed by the client CA certificate
  client.key     the client key (0600); client.crt and client.key go to every kube-apiserver
  Renew with --ca-cert ./qg-client/client-ca.crt --ca-key ./qg-client/client-ca.key --force.

Exit status: 0 on success, 2 on any error (nothing is overwritten without --force).")]
pub struct CertsArgs {
    /// Directory to write ca.crt, ca.key (new CA only), tls.crt and tls.key into (created if
    /// missing, mode 0700).
    #[arg(long, value_name = "DIR", env = "QUORUMGUARD_CERTS_OUT_DIR")]
    pub out_dir: PathBuf,
    /// Overwrite existing files in --out-dir (each is replaced atomically). Without it, nothing
    /// is written if any of them exists.
    #[arg(long)]
    pub force: bool,
    /// The webhook Service (clientConfig.service.name).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_SERVICE, env = "QUORUMGUARD_CERTS_SERVICE")]
    pub service: String,
    /// The Service's namespace, also where the Secret goes.
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_NAMESPACE, env = "QUORUMGUARD_CERTS_NAMESPACE")]
    pub namespace: String,
    /// An extra subject alternative name: a DNS name (`*.` wildcard allowed) or an IP address
    /// (repeatable; the env twin is comma-separated). The Service's names are always included:
    /// SVC, SVC.NS, SVC.NS.svc, SVC.NS.svc.cluster.local.
    #[arg(
        long = "dns-name",
        value_name = "NAME",
        env = "QUORUMGUARD_CERTS_DNS_NAMES",
        value_delimiter = ','
    )]
    pub dns_names: Vec<String>,
    /// Validity of the issued certificate in days (a new CA is valid 10 years; a given CA must
    /// outlive the certificate).
    #[arg(
        long,
        value_name = "DAYS",
        default_value_t = DEFAULT_DAYS,
        env = "QUORUMGUARD_CERTS_DAYS",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_DAYS))
    )]
    pub days: u32,
    /// Sign with this existing CA certificate (PEM) instead of making a new CA; the caBundle
    /// then stays the same across renewals. Needs --ca-key.
    #[arg(
        long,
        value_name = "FILE",
        requires = "ca_key",
        env = "QUORUMGUARD_CERTS_CA_CERT"
    )]
    pub ca_cert: Option<PathBuf>,
    /// The CA's private key (PKCS#8 PEM, `-----BEGIN PRIVATE KEY-----`). Needs --ca-cert.
    #[arg(
        long,
        value_name = "FILE",
        requires = "ca_cert",
        env = "QUORUMGUARD_CERTS_CA_KEY"
    )]
    pub ca_key: Option<PathBuf>,
    /// The Secret name in the printed `kubectl create secret tls` command (the Deployment
    /// mounts quorumguard-webhook-tls).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_SECRET)]
    pub secret_name: String,
    /// Print the caBundle (base64 of ca.crt) on stdout, for clientConfig.caBundle.
    #[arg(long)]
    pub print_ca_bundle: bool,
    /// Set clientConfig.caBundle of every webhook in this ValidatingWebhookConfiguration (the
    /// manifests install `quorumguard`), with a JSON patch through the API server.
    #[arg(long, value_name = "NAME", env = "QUORUMGUARD_CERTS_PATCH_WEBHOOK")]
    pub patch_webhook: Option<String>,
    /// Kubeconfig for --patch-webhook. Default: $KUBECONFIG, ~/.kube/config, or the in-cluster
    /// service account, as kubectl does.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context for --patch-webhook (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Issue kube-apiserver's client certificate for the webhook instead of the serving pair:
    /// common name NAME (what `serve --client-name` is given, e.g. kube-apiserver), clientAuth,
    /// signed by a new client CA or by --ca-cert/--ca-key. Writes client-ca.crt, client-ca.key
    /// (new CA only), client.crt and client.key; not with the serving pair's --dns-name,
    /// --service, --secret-name, --print-ca-bundle or --patch-webhook.
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with_all = [
            "dns_names",
            "service",
            "secret_name",
            "print_ca_bundle",
            "patch_webhook",
            "kubeconfig",
            "context",
        ]
    )]
    pub client: Option<String>,
}

pub fn run(args: &CertsArgs) -> anyhow::Result<ExitCode> {
    let now = unix_now()?;
    let ca = match (&args.ca_cert, &args.ca_key) {
        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
        (None, None) => None,
        _ => bail!("--ca-cert and --ca-key go together"),
    };
    if let Some(name) = &args.client {
        return run_client(args, name, ca, now);
    }
    let request = Request {
        service: args.service.clone(),
        namespace: args.namespace.clone(),
        extra_names: args.dns_names.clone(),
        days: args.days,
        ca,
    };
    let bundle = generate(&request, now).map_err(|e| match &args.ca_cert {
        Some(path) if is_ca_problem(&e) => anyhow!("{}: {e}", path.display()),
        _ => anyhow!(e),
    })?;
    let ca_bundle = bundle.ca_bundle()?;
    // Before anything is written: is the configuration there to be patched?
    let target = match &args.patch_webhook {
        Some(name) => Some(WebhookTarget::find(args, name)?),
        None => None,
    };
    let written = write_files(&args.out_dir, &bundle.files(), args.force)?;
    // Absolute paths in the printed commands, so they work from any directory.
    let out_dir = std::path::absolute(&args.out_dir).unwrap_or_else(|_| args.out_dir.clone());
    let shown = |name: &str| out_dir.join(name);
    let ca_key = match &args.ca_key {
        Some(path) => std::path::absolute(path).unwrap_or_else(|_| path.clone()),
        None => shown(CA_KEY_FILE),
    };
    let again = |webhook: &str| {
        format!(
            "quorumguard certs --out-dir {} --ca-cert {} --ca-key {} --force --patch-webhook {}",
            quote(&out_dir),
            quote(&shown(CA_CERT_FILE)),
            quote(&ca_key),
            shell_quote(webhook),
        )
    };

    eprintln!("quorumguard: wrote {}", list(&written));
    match &bundle.new_ca_key_pem {
        Some(_) => eprintln!(
            "  {CA_CERT_FILE}: a new CA, valid until {}; {CA_KEY_FILE} is its key: keep it secret \
             (or delete it and make a new CA, and caBundle, at each renewal)",
            format_time(bundle.ca_not_after)
        ),
        None => eprintln!(
            "  {CA_CERT_FILE}: the given CA, valid until {}",
            format_time(bundle.ca_not_after)
        ),
    }
    eprintln!(
        "  {CERT_FILE}: serving certificate and CA, valid until {}, for {}",
        format_time(bundle.not_after),
        bundle.dns_names.join(", ")
    );

    if args.print_ca_bundle {
        println!("{ca_bundle}");
    }

    eprintln!();
    eprintln!("Store the serving certificate where the Deployment mounts it:");
    eprintln!(
        "  {}",
        kubectl_create_secret(
            &args.secret_name,
            &args.namespace,
            &shown(CERT_FILE),
            &shown(KEY_FILE)
        )
    );
    eprintln!(
        "  (to replace an existing Secret, append `--dry-run=client -o yaml | kubectl apply -f -`)"
    );

    match target {
        Some(target) => {
            target.patch(&ca_bundle).with_context(|| {
                format!(
                    "the files are written; to try again with the same CA: {}",
                    again(&target.name)
                )
            })?;
            eprintln!();
            eprintln!(
                "quorumguard: set the caBundle of ValidatingWebhookConfiguration {}: {}",
                target.name,
                target.webhooks.join(", ")
            );
        }
        None => {
            eprintln!();
            eprintln!(
                "Give the API server this CA: every webhook's clientConfig.caBundle must be the \
                 --print-ca-bundle value. --patch-webhook does it; to do it now with this CA \
                 (a new serving certificate is issued: run the Secret command it prints):"
            );
            eprintln!("  {}", again(DEFAULT_WEBHOOK_CONFIGURATION));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--client NAME`: the client CA and kube-apiserver's client certificate, and what to do next.
fn run_client(
    args: &CertsArgs,
    name: &str,
    ca: Option<(String, String)>,
    now: i64,
) -> anyhow::Result<ExitCode> {
    let request = ClientRequest {
        name: name.to_string(),
        days: args.days,
        ca,
    };
    let bundle = generate_client(&request, now).map_err(|e| match &args.ca_cert {
        Some(path) if is_ca_problem(&e) => anyhow!("{}: {e}", path.display()),
        _ => anyhow!("--client {name}: {e}"),
    })?;
    let written = write_files(&args.out_dir, &bundle.files(), args.force)?;
    let out_dir = std::path::absolute(&args.out_dir).unwrap_or_else(|_| args.out_dir.clone());
    let shown = |file: &str| out_dir.join(file);
    let ca_key = match &args.ca_key {
        Some(path) => std::path::absolute(path).unwrap_or_else(|_| path.clone()),
        None => shown(CLIENT_CA_KEY_FILE),
    };

    eprintln!("quorumguard: wrote {}", list(&written));
    match &bundle.new_ca_key_pem {
        Some(_) => eprintln!(
            "  {CLIENT_CA_CERT_FILE}: a new client CA, valid until {}; {CLIENT_CA_KEY_FILE} is \
             its key: keep it offline (serve only needs {CLIENT_CA_CERT_FILE})",
            format_time(bundle.ca_not_after)
        ),
        None => eprintln!(
            "  {CLIENT_CA_CERT_FILE}: the given client CA, valid until {}",
            format_time(bundle.ca_not_after)
        ),
    }
    eprintln!(
        "  {CLIENT_CERT_FILE}: client certificate CN={name} (client authentication) and the CA, \
         valid until {}",
        format_time(bundle.not_after)
    );
    eprintln!();
    eprintln!("Give serve the client CA (the client-auth Deployment patch mounts this Secret):");
    eprintln!(
        "  kubectl -n {} create secret generic {CLIENT_CA_SECRET} --from-file=ca.crt={}",
        shell_quote(&args.namespace),
        quote(&shown(CLIENT_CA_CERT_FILE))
    );
    eprintln!(
        "  and run serve with --client-ca-file=/client-ca/ca.crt --client-name={}",
        shell_quote(name)
    );
    eprintln!();
    eprintln!(
        "Give every kube-apiserver {} and {} (mode 0600), named by the user entry of its \
         admission kubeconfig (SECURITY.md, \"Verifying kube-apiserver's client certificate\").",
        quote(&shown(CLIENT_CERT_FILE)),
        quote(&shown(CLIENT_KEY_FILE))
    );
    eprintln!();
    eprintln!("Renew with the same client CA (serve's --client-ca-file stays):");
    eprintln!(
        "  quorumguard certs --out-dir {} --client {} --ca-cert {} --ca-key {} --force",
        quote(&out_dir),
        shell_quote(name),
        quote(&shown(CLIENT_CA_CERT_FILE)),
        quote(&ca_key),
    );
    Ok(ExitCode::SUCCESS)
}

fn is_ca_problem(e: &CertError) -> bool {
    use CertError::*;
    matches!(
        e,
        CaCertPem(_) | CaCertDer(_) | NotCa(_) | NotCertSigner | CaSubject(_) | CaValidity(_)
    )
}

fn unix_now() -> anyhow::Result<i64> {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the clock is before 1970")?;
    i64::try_from(since.as_secs()).context("the clock is too far in the future")
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))
}

fn quote(path: &Path) -> String {
    shell_quote(&path.display().to_string())
}

fn list(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

/// The command that stores the serving certificate where the Deployment mounts it.
fn kubectl_create_secret(secret: &str, namespace: &str, cert: &Path, key: &Path) -> String {
    format!(
        "kubectl create secret tls {} -n {} --cert={} --key={}",
        shell_quote(secret),
        shell_quote(namespace),
        shell_quote(&cert.display().to_string()),
        shell_quote(&key.display().to_string()),
    )
}

/// Quotes for a POSIX shell when needed.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+@%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
