//! quorumguard-pki's integration tests in one binary, one module per subject: the webhook port's
//! TLS: protocol versions, chains, hot reload, client certificates. `cargo test -p quorumguard-pki`
//! runs them (and the crate's unit tests); one subject: `cargo test -p quorumguard-pki --test it
//! tls_reload::`. Shared fixtures come from the dev-only `quorumguard-testkit` crate
//! (`crates/testkit/`, here as `testkit`); the tests of the binary and of the repository stay in
//! the root package's `tests/it/` (docs/development.md, "Where the tests are").

mod client_auth;
mod tls_reload;
