//! `quorumguard certs`: the webhook's serving certificate on clusters without cert-manager.
//!
//! Makes a CA (or reuses one), issues a serving certificate for the webhook Service's DNS names,
//! writes `ca.crt`, `ca.key` (new CA only), `tls.crt` (chain) and `tls.key`, and tells how to
//! install them. Optionally prints the caBundle or patches it into the
//! ValidatingWebhookConfiguration. The CA and the certificates come from [`crate::certs`]; this
//! is what the command adds: the Service's names, the files, the printed commands and the patch.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use crate::certs::{self, Ca, CertError, MAX_DAYS, format_time};

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

/// How to give `--ca-key` as PKCS#8.
const PKCS8_HINT: &str = "A PKCS#8 key (`-----BEGIN PRIVATE KEY-----`, ECDSA P-256/P-384, \
     Ed25519 or RSA) is needed; convert with `openssl pkcs8 -topk8 -nocrypt -in ca.key -out \
     ca.pk8.key`";
/// The annotation that makes cert-manager's cainjector own a webhook configuration's caBundle.
const INJECT_CA_ANNOTATION: &str = "cert-manager.io/inject-ca-from";

/// How long talking to the API server may take, in all, for `--patch-webhook`.
const PATCH_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// Validity of the serving certificate in days (a new CA is valid 10 years; a given CA must
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
}

pub fn run(args: &CertsArgs) -> anyhow::Result<ExitCode> {
    let now = unix_now()?;
    let ca = match (&args.ca_cert, &args.ca_key) {
        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
        (None, None) => None,
        _ => bail!("--ca-cert and --ca-key go together"),
    };
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

/// The ValidatingWebhookConfiguration to patch, found (and its webhooks listed) before any
/// file is written, so a wrong name or an unreachable API server leaves nothing behind.
struct WebhookTarget {
    runtime: tokio::runtime::Runtime,
    api: Api<ValidatingWebhookConfiguration>,
    name: String,
    webhooks: Vec<String>,
}

impl WebhookTarget {
    fn find(args: &CertsArgs, name: &str) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let (api, webhooks) = runtime.block_on(bounded(name, find_webhooks(args, name)))?;
        Ok(Self {
            runtime,
            api,
            name: name.to_string(),
            webhooks,
        })
    }

    /// Sets `caBundle` of every webhook with one JSON patch, which fails if the webhooks
    /// changed since [`WebhookTarget::find`] read them.
    fn patch(&self, ca_bundle: &str) -> anyhow::Result<()> {
        let name = &self.name;
        let patch = serde_json::from_value(ca_bundle_patch(&self.webhooks, ca_bundle))
            .context("cannot build the JSON patch")?;
        self.runtime.block_on(bounded(name, async {
            self.api
                .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
                .with_context(|| format!("cannot patch ValidatingWebhookConfiguration {name}"))?;
            Ok(())
        }))
    }
}

/// Bounds a conversation with the API server by [`PATCH_TIMEOUT`].
async fn bounded<T>(
    name: &str,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(PATCH_TIMEOUT, work)
        .await
        .map_err(|_| {
            anyhow!(
                "--patch-webhook {name}: no answer from the API server within {}s",
                PATCH_TIMEOUT.as_secs()
            )
        })?
}

async fn find_webhooks(
    args: &CertsArgs,
    name: &str,
) -> anyhow::Result<(Api<ValidatingWebhookConfiguration>, Vec<String>)> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            std::fs::File::open(path)
                .with_context(|| format!("{}: cannot read", path.display()))?;
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("{}: not a kubeconfig", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("{}: unusable kubeconfig", path.display()))?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("cannot load the kubeconfig")?,
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found (use --kubeconfig)")?,
    };
    let client = kube::Client::try_from(config).context("cannot make a Kubernetes client")?;
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let vwc = api
        .get_opt(name)
        .await
        .with_context(|| format!("cannot read ValidatingWebhookConfiguration {name}"))?
        .ok_or_else(|| {
            anyhow!(
                "ValidatingWebhookConfiguration {name} not found: apply the manifests first \
                 (kubectl apply -k manifests/no-cert-manager/); nothing was written"
            )
        })?;
    if let Some(owner) = vwc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INJECT_CA_ANNOTATION))
    {
        eprintln!(
            "quorumguard: warning: ValidatingWebhookConfiguration {name} has \
             {INJECT_CA_ANNOTATION}: {owner}: cert-manager's cainjector will overwrite this \
             caBundle. Without cert-manager, install manifests/no-cert-manager/ instead."
        );
    }
    let webhooks: Vec<String> = vwc
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.name)
        .collect();
    if webhooks.is_empty() {
        bail!("ValidatingWebhookConfiguration {name} has no webhooks to patch");
    }
    Ok((api, webhooks))
}

// The serving certificate for the webhook Service, and where it goes.

/// The names the API server may use for the Service: `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc`,
/// `<svc>.<ns>.svc.cluster.local`, then each extra name (a DNS name, `*.` wildcard allowed, or
/// an IP address), without duplicates, in that order.
fn service_dns_names(
    service: &str,
    namespace: &str,
    extra: &[String],
) -> Result<Vec<String>, CertError> {
    check_label("--service", service)?;
    check_label("--namespace", namespace)?;
    let mut names = vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    for name in extra {
        check_extra_name(name)?;
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    Ok(names)
}

/// A DNS-1123 label, as Kubernetes requires of Service and Namespace names.
fn check_label(what: &'static str, name: &str) -> Result<(), CertError> {
    label_problem(name).map_or(Ok(()), |reason| {
        Err(CertError::InvalidName {
            what,
            name: name.to_string(),
            reason: reason.to_string(),
        })
    })
}

fn label_problem(label: &str) -> Option<&'static str> {
    if label.is_empty() {
        return Some("empty label");
    }
    if label.len() > 63 {
        return Some("a label is longer than 63 characters");
    }
    if !label
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some("only lowercase letters, digits and '-' are allowed");
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Some("a label must start and end with a letter or digit");
    }
    None
}

fn check_extra_name(name: &str) -> Result<(), CertError> {
    if name.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let invalid = |reason: &str| CertError::InvalidName {
        what: "--dns-name",
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.len() > 253 {
        return Err(invalid("longer than 253 characters"));
    }
    let rest = name.strip_prefix("*.").unwrap_or(name);
    for label in rest.split('.') {
        if let Some(reason) = label_problem(label) {
            return Err(invalid(reason));
        }
    }
    Ok(())
}

/// What `quorumguard certs` asks for.
#[derive(Clone, Debug)]
struct Request {
    service: String,
    namespace: String,
    extra_names: Vec<String>,
    days: u32,
    /// An existing CA (certificate PEM, key PEM); `None` makes a new one.
    ca: Option<(String, String)>,
}

/// Everything to write and print.
#[derive(Clone)]
struct Bundle {
    /// The CA certificate: `ca.crt`, and the caBundle.
    ca_cert_pem: String,
    /// The CA key, only when the CA is new (`ca.key`); a given CA's key stays where it is.
    new_ca_key_pem: Option<String>,
    /// The serving certificate followed by the CA certificate: `tls.crt`.
    chain_pem: String,
    /// `tls.key`.
    key_pem: String,
    dns_names: Vec<String>,
    not_after: i64,
    ca_not_after: i64,
}

impl std::fmt::Debug for Bundle {
    /// Leaves the keys out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundle")
            .field("dns_names", &self.dns_names)
            .field("new_ca", &self.new_ca_key_pem.is_some())
            .field("not_after", &format_time(self.not_after))
            .field("ca_not_after", &format_time(self.ca_not_after))
            .finish_non_exhaustive()
    }
}

/// Makes (or loads) the CA and issues the serving certificate for the Service's names.
fn generate(req: &Request, now: i64) -> Result<Bundle, CertError> {
    certs::check_days(req.days)?;
    let dns_names = service_dns_names(&req.service, &req.namespace, &req.extra_names)?;
    let (ca, new_ca) = match &req.ca {
        Some((cert, key)) => {
            // The certificate's problems come first; then a key that is not PKCS#8 gets the
            // hint to convert it, even one the library could read.
            let ca = Ca::from_pem(cert, key);
            if matches!(
                ca,
                Ok(_) | Err(CertError::CaKey(_) | CertError::CaKeyMismatch)
            ) {
                require_pkcs8(key)?;
            }
            (ca?, false)
        }
        None => (Ca::generate(now)?, true),
    };
    // `<svc>.<ns>.svc`, the name the API server dials; a CN is limited to 64 characters.
    let svc_name = format!("{}.{}.svc", req.service, req.namespace);
    let cn = if svc_name.len() <= 64 {
        svc_name.as_str()
    } else {
        req.service.as_str()
    };
    let leaf = ca.issue(cn, &dns_names, req.days, now)?;
    let mut chain_pem = leaf.cert_pem.clone();
    if !chain_pem.ends_with('\n') {
        chain_pem.push('\n');
    }
    chain_pem.push_str(ca.cert_pem());
    Ok(Bundle {
        ca_cert_pem: ca.cert_pem().to_string(),
        new_ca_key_pem: new_ca.then(|| ca.key_pem().to_string()),
        chain_pem,
        key_pem: leaf.key_pem,
        dns_names,
        not_after: leaf.not_after,
        ca_not_after: ca.not_after(),
    })
}

/// The command asks for a PKCS#8 CA key, as its help says, and tells how to convert another
/// (the library reads PKCS#1 and SEC1 keys too).
fn require_pkcs8(pem: &str) -> Result<(), CertError> {
    let problem = [
        ("EC PRIVATE KEY", "it is a SEC1 EC key"),
        ("RSA PRIVATE KEY", "it is a PKCS#1 RSA key"),
        ("ENCRYPTED PRIVATE KEY", "it is encrypted"),
    ]
    .into_iter()
    .find(|(label, _)| pem.contains(&format!("-----BEGIN {label}-----")))
    .map(|(_, problem)| problem)
    .or((!pem.contains("-----BEGIN PRIVATE KEY-----"))
        .then_some("no `-----BEGIN PRIVATE KEY-----` block"));
    problem.map_or(Ok(()), |p| {
        Err(CertError::CaKey(format!("{p}. {PKCS8_HINT}")))
    })
}

/// A file to write: its name in the output directory, contents and Unix mode.
#[derive(Clone)]
struct OutputFile {
    name: &'static str,
    contents: String,
    mode: u32,
}

impl std::fmt::Debug for OutputFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputFile")
            .field("name", &self.name)
            .field("mode", &format_args!("{:o}", self.mode))
            .finish_non_exhaustive()
    }
}

impl Bundle {
    /// `ca.crt`, `ca.key` (new CA only), `tls.crt`, `tls.key`: keys 0600, certificates 0644.
    fn files(&self) -> Vec<OutputFile> {
        let mut files = vec![OutputFile {
            name: CA_CERT_FILE,
            contents: self.ca_cert_pem.clone(),
            mode: 0o644,
        }];
        if let Some(key) = &self.new_ca_key_pem {
            files.push(OutputFile {
                name: CA_KEY_FILE,
                contents: key.clone(),
                mode: 0o600,
            });
        }
        files.push(OutputFile {
            name: CERT_FILE,
            contents: self.chain_pem.clone(),
            mode: 0o644,
        });
        files.push(OutputFile {
            name: KEY_FILE,
            contents: self.key_pem.clone(),
            mode: 0o600,
        });
        files
    }

    /// The `caBundle` value: base64 of the CA certificate's PEM.
    fn ca_bundle(&self) -> Result<String, CertError> {
        certs::ca_bundle(&self.ca_cert_pem)
    }
}

/// Why the output files were not written.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("{} already exist{}: pass --force to overwrite", list(.0), if .0.len() == 1 { "s" } else { "" })]
    Exists(Vec<PathBuf>),
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Writes `files` into `dir` (created, 0700, if missing). Without `force`, nothing is written
/// if any of them exists. With `force`, each file is replaced atomically (written aside, then
/// renamed), so a key never exists with a wider mode or half-written. Returns the paths.
fn write_files(dir: &Path, files: &[OutputFile], force: bool) -> Result<Vec<PathBuf>, WriteError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError::Io { path, source }
    };
    if !dir.is_dir() {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(io(dir))?;
    }
    let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f.name)).collect();
    if !force {
        let existing: Vec<PathBuf> = paths
            .iter()
            .filter(|p| fs::symlink_metadata(p).is_ok())
            .cloned()
            .collect();
        if !existing.is_empty() {
            return Err(WriteError::Exists(existing));
        }
    }
    for (file, path) in files.iter().zip(&paths) {
        if force {
            let tmp = dir.join(format!(".{}.tmp-{}", file.name, std::process::id()));
            // A leftover from an interrupted run.
            let _ = fs::remove_file(&tmp);
            create_file(&tmp, file).map_err(io(&tmp))?;
            fs::rename(&tmp, path).map_err(|source| {
                let _ = fs::remove_file(&tmp);
                WriteError::Io {
                    path: path.clone(),
                    source,
                }
            })?;
        } else {
            // create_new: if something appeared since the check above, refuse rather than
            // overwrite.
            create_file(path, file).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    WriteError::Exists(vec![path.clone()])
                } else {
                    WriteError::Io {
                        path: path.clone(),
                        source: e,
                    }
                }
            })?;
        }
    }
    Ok(paths)
}

fn create_file(path: &Path, file: &OutputFile) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, file.mode);
    let mut f = options.open(path)?;
    // The umask may have narrowed the mode; certificates should stay readable.
    #[cfg(unix)]
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(file.mode))?;
    f.write_all(file.contents.as_bytes())?;
    f.sync_all()
}

/// A JSON patch (RFC 6902) setting `clientConfig.caBundle` of every webhook, in the order the
/// configuration lists them. Each webhook's name is tested first, so the patch fails rather
/// than touch the wrong entry if the list changed since it was read.
fn ca_bundle_patch(webhook_names: &[String], ca_bundle: &str) -> Value {
    let mut ops = Vec::with_capacity(webhook_names.len() * 2);
    for (i, name) in webhook_names.iter().enumerate() {
        ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": name}));
        ops.push(json!({
            "op": "add",
            "path": format!("/webhooks/{i}/clientConfig/caBundle"),
            "value": ca_bundle,
        }));
    }
    Value::Array(ops)
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

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::ByteString;
    use rcgen::{KeyPair, PublicKeyData};

    use crate::certs::tests::{DAY, NOW, TempDir, facts};

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
}
