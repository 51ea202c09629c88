//! quorumguard-playground's integration tests in one binary, one module per subject: the API-server
//! stand-in and its calls to the webhook. `cargo test -p quorumguard-playground` runs them (and the
//! crate's unit tests); one subject: `cargo test -p quorumguard-playground --test it
//! apiserver_standin::`. Shared fixtures come from the dev-only `quorumguard-testkit` crate
//! (`crates/testkit/`, here as `testkit`); the tests of the binary and of the repository stay in
//! the root package's `tests/it/` (docs/development.md, "Where the tests are").

mod apiserver_standin;
mod playground_webhooks;
