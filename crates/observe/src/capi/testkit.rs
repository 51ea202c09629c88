//! Helpers the tests of this crate and of the crates above it share (the `testkit` feature, a
//! dev-dependency of `quorumguard-admission`): the AdmissionReview fixtures.

use serde_json::Value;

/// One review of tests/fixtures/admission-reviews/, parsed.
pub fn review(name: &str) -> Value {
    let path = format!(
        "{}/../../tests/fixtures/admission-reviews/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    serde_json::from_str(&text).expect("fixture is JSON")
}
