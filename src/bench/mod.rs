//! Benchmarks over the simulated upstream (`tailcut bench ...`).

mod hedge;
mod plot;

pub use hedge::{hedge, HedgeArgs};
