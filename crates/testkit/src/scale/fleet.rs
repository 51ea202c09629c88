//! What the scale run starts: the fleet (real etcd clusters, the seeded API-server stand-in and,
//! for `--transport port-forward`, a workload stand-in per etcd cluster) and the guard, the
//! `quorumguard serve` child process.

use super::*;

/// The etcd clusters and the seeded stand-in.
pub struct Fleet {
    pub api: Arc<ApiServer>,
    /// Workload cluster names, in seeding order.
    pub clusters: Vec<String>,
    pub objects: usize,
    _etcd: Vec<EtcdCluster>,
    /// With `--transport port-forward`: the workload API-server stand-ins, one per etcd cluster.
    _workloads: Vec<ApiServer>,
}

/// `cp-a`, `cp-b`, ...: the node (and so etcd member) names of every workload cluster.
fn member_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("cp-{}", char::from(b'a' + i as u8)))
        .collect()
}

/// Workload cluster `i`: the fixtures' `test` first, then `wl-0001`, ...
pub fn cluster_name(i: usize) -> String {
    if i == 0 {
        "test".into()
    } else {
        format!("wl-{i:04}")
    }
}

impl Fleet {
    /// Starts the etcd clusters (one after the other: each waits for its members' health) and
    /// the stand-in, and seeds it.
    pub async fn start(o: &ScaleOptions, dir: PathBuf) -> Result<Fleet> {
        let names = member_names(o.members);
        let mut etcd = Vec::new();
        for _ in 0..o.etcd_clusters {
            let options = EtcdOptions {
                parent_dir: Some(dir.clone()),
                names: names.clone(),
                ..EtcdOptions::new(o.members)
            };
            let cluster = tokio::task::spawn_blocking(move || EtcdCluster::start_with(options))
                .await?
                .context("starting an etcd cluster")?;
            for i in 0..cluster.len() {
                if let Some(pid) = cluster.pid(i) {
                    renice(pid, o.etcd_nice)?;
                }
            }
            etcd.push(cluster);
        }
        let api = Arc::new(
            ApiServer::start()
                .await
                .context("the API-server stand-in")?,
        );
        let mut workloads = Vec::new();
        if o.port_forward {
            for e in &etcd {
                workloads.push(crate::etcd::workload_api(e).await?);
            }
        }
        let mut clusters = Vec::new();
        for i in 0..o.kcps {
            let name = cluster_name(i);
            let e = &etcd[i % etcd.len()];
            let annotations = match workloads.get(i % etcd.len()) {
                None => json!({
                    "quorumguard.io/etcd-endpoints": e.endpoints().join(","),
                    "quorumguard.io/etcd-transport": "direct",
                }),
                Some(w) => {
                    api.insert(seed::secret(
                        NS,
                        &format!("{name}-kubeconfig"),
                        &[("value", &w.kubeconfig_yaml())],
                    ))
                    .context("seeding a workload kubeconfig")?;
                    json!({ "quorumguard.io/etcd-transport": "port-forward" })
                }
            };
            let replicas = o.members;
            seed::cluster(&api, NS, &name, annotations, &names, Some(&e.pki), |k| {
                k["spec"]["replicas"] = json!(replicas)
            });
            clusters.push(name);
        }
        Ok(Fleet {
            api,
            objects: clusters.len() * (3 + names.len() + usize::from(o.port_forward)),
            clusters,
            _etcd: etcd,
            _workloads: workloads,
        })
    }
}

/// `quorumguard serve` as a child process; killed when dropped.
pub struct Guard {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub log: PathBuf,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> Result<SocketAddr> {
    Ok(quorumguard::playground::ports::free_addr()?)
}

impl Guard {
    /// Starts the binary against `api`, serving `pki`'s certificate, logging warnings to
    /// `<dir>/guard.log`.
    pub fn start(
        api: &ApiServer,
        pki: &TestPki,
        dir: &std::path::Path,
        o: &ScaleOptions,
    ) -> Result<Guard> {
        let kubeconfig = dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)?;
        let log = dir.join("guard.log");
        let (addr, admin) = (free_addr()?, free_addr()?);
        let child = Command::new(crate::paths::quorumguard_bin())
            .arg("serve")
            .arg(format!("--listen={addr}"))
            .arg(format!("--admin-listen={admin}"))
            .arg(format!("--tls-cert-file={}", pki.cert_file.display()))
            .arg(format!("--tls-key-file={}", pki.key_file.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--probe-interval={}",
                humantime::format_duration(o.probe_interval)
            ))
            .arg(format!("--probe-concurrency={}", o.probe_concurrency))
            .arg(if o.port_forward {
                "--etcd-transport=port-forward"
            } else {
                "--etcd-transport=direct"
            })
            .args([
                "--no-leader-election",
                "--log=warn",
                "--shutdown-delay=0s",
                "--shutdown-grace=1s",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting quorumguard serve")?;
        Ok(Guard {
            child,
            addr,
            admin,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The end of the guard's log, to explain a failure.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Fails when the process has exited.
    pub(super) fn alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!(
                "quorumguard serve exited ({status}); its log:\n{}",
                self.log_tail()
            ),
            None => Ok(()),
        }
    }
}
