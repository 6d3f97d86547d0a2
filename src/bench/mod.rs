//! Benchmarks over the simulated upstream (`tailcut bench ...`).

mod hedge;
mod overhead;
mod plot;
mod process;

pub use hedge::{hedge, HedgeArgs};
pub use overhead::{overhead, OverheadArgs};
