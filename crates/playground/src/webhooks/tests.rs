//! The dispatch's unit tests, one file per part under `tests/`: which writes are sent
//! (`matching.rs`), the request sent (`review.rs`), and the answers and failures read back
//! (`answers.rs`).

mod answers;
mod matching;
mod review;

const MACHINES: &str = "machines.quorumguard.io";
const KCPS: &str = "kubeadmcontrolplanes.quorumguard.io";
