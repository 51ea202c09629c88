//! quorumguard-autopilot's integration tests in one binary, one module per subject: its etcd
//! calls and the pilot's turn on real etcd (127.0.0.1, TLS, testkit's clusters), the Machine
//! deletion on the API-server stand-in. `cargo test -p quorumguard-autopilot` runs them; one
//! subject: `cargo test -p quorumguard-autopilot --test it etcd_actions::`.

mod etcd_actions;
mod machine_deletion;
mod pilot;
mod probe;
