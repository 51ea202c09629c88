//! quorumguard-admission's integration tests in one binary, one module per subject: the webhook
//! over real HTTPS: reviews, Events, live health, races, bad input; and the budgets of a review
//! and of a probe (`budgets`; its counting allocator is this binary's global allocator). `cargo
//! test -p quorumguard-admission` runs them (and the crate's unit tests); one subject: `cargo
//! test -p quorumguard-admission --test it webhook::`. Shared fixtures come from the dev-only
//! `quorumguard-testkit` crate (`crates/testkit/`, here as `testkit`); the tests of the binary and
//! of the repository stay in the root package's `tests/it/` (docs/development.md, "Where the tests
//! are").

mod bad_input;
mod budgets;
mod events;
mod live_health;
mod races;
mod webhook;
