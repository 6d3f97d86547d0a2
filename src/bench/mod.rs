//! Benchmarks over the simulated upstream (`tailcut bench ...`).

mod hedge;

pub use hedge::{hedge, HedgeArgs};
