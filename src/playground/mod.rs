//! The playground: quorumguard against a real etcd cluster, on loopback, without Kubernetes.
//!
//! Issue 5 asks for `quorumguard playground`: a real 3-member etcd cluster with TLS, an
//! embedded API server holding a Cluster, its KubeadmControlPlane and three control-plane
//! Machines whose nodes match the etcd member names, and `quorumguard serve` pointed at them.
//! This module holds the foundation it is built on; the scenarios and the subcommand are not
//! here yet.
//!
//! - [`apiserver`]: an in-memory **stand-in** for kube-apiserver speaking the Kubernetes REST
//!   protocol over plain HTTP on 127.0.0.1, enough for a real `kube::Client`, `kubectl` and
//!   quorumguard's own watches, status writes, Leases and port-forwards. It is not Kubernetes:
//!   no authentication or authorization, no TLS, no CRD schemas, no server-side apply, no
//!   garbage collector, no webhooks called (one in-process admission hook only). Its module
//!   documentation lists exactly what it does and what it does not do; nothing it shows proves
//!   what a real cluster would do.
//! - [`etcd`]: real `etcd` processes (from PATH) on 127.0.0.1 with client and peer TLS, under a
//!   CA shaped like Cluster API's `<cluster>-etcd` Secret, and the faults the playground and
//!   the tests need: freeze (SIGSTOP), thaw, kill, remove a member, add and start a learner.
//!
//! The integration tests (`tests/`) use both through `tests/support`.

pub mod apiserver;
pub mod etcd;
