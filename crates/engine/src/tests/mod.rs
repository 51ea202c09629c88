//! Tests of the engine: hand-worked tables per rule, the named cases, and the exhaustive search.

mod admit;
mod exhaustive;
mod next;
mod rules;
