//! Code shared by the integration tests. Each test crate uses part of it, so items one crate
//! leaves unused are expected.
#![allow(dead_code, unused_imports)]

pub mod envtest;
pub mod etcd;
pub mod guard;
pub mod https;
pub mod kit;
pub mod logs;
pub mod manifests;
pub mod reviews;
pub mod seed;

/// The API-server stand-in lives in the library (the playground serves it).
pub use quorumguard::playground::apiserver;
