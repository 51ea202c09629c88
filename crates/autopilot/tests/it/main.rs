//! quorumguard-autopilot's integration tests in one binary, one module per subject, on real etcd
//! (127.0.0.1, TLS, testkit's clusters). `cargo test -p quorumguard-autopilot` runs them; one
//! subject: `cargo test -p quorumguard-autopilot --test it etcd_actions::`.

mod etcd_actions;
mod machine_deletion;
