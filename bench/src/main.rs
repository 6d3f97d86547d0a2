//! The `tailcut-bench` command: load benchmarks over the simulated upstream. `hedge` runs
//! tailcut in this process; `overhead`, `streams` and `hold` run tailcut and a bare
//! pass-through proxy as server processes of their own (`server`, started by this binary)
//! and drive them from one lean client on a current-thread runtime.
//!
//! A crate of its own so the server binary links neither these nor plotters.

mod alloc;
mod bare;
mod client;
mod figures;
mod hedge;
mod hold;
mod overhead;
mod plot;
mod process;
mod rig;
mod server;
mod streams;

use std::future::Future;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Every allocation counted, so server processes report allocations per request and event.
#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

#[derive(Parser)]
#[command(
    name = "tailcut-bench",
    version,
    about = "Benchmarks of tailcut over the simulated upstream"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Hedging off vs on over two `spiky` routes: TTFT percentiles, extra load, cancel latency.
    Hedge(hedge::HedgeArgs),
    /// Added TTFT at concurrency 1, tailcut beside a bare pass-through proxy (paired deltas).
    Overhead(overhead::OverheadArgs),
    /// Inter-chunk gaps, fidelity and cost per event at N streams, beside the bare proxy.
    Streams(streams::StreamsArgs),
    /// RSS per held stream and idle WebSocket, and after many streams, beside the bare proxy.
    Hold(hold::HoldArgs),
    /// A server process under test (started by the other modes).
    #[command(hide = true)]
    Server(server::ServerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let result = match cli.command {
        Command::Hedge(args) => multi_thread(hedge::hedge(args)),
        Command::Server(args) => multi_thread(server::serve(args)),
        Command::Overhead(args) => lean_client(overhead::overhead(args)),
        Command::Streams(args) => lean_client(streams::streams(args)),
        Command::Hold(args) => lean_client(hold::hold(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tailcut-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn multi_thread(work: impl Future<Output = Result<(), String>>) -> Result<(), String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?
        .block_on(work)
}

/// The client on a current-thread runtime; the simulated upstream it starts runs on a
/// one-worker runtime of its own.
fn lean_client(work: impl Future<Output = Result<(), String>>) -> Result<(), String> {
    let upstream = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("upstream")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    // The runtime lives until `work` is done; `upstream()` hands it to the rig.
    let _ = UPSTREAM.set(upstream.handle().clone());
    client.block_on(work)
}

static UPSTREAM: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();

/// The runtime the simulated upstream runs on in the lean-client modes.
pub fn upstream() -> Option<tokio::runtime::Handle> {
    UPSTREAM.get().cloned()
}

/// The server's log, filtered by `TAILCUT_LOG` as in `tailcut serve`, on stderr: stdout
/// carries the result tables.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TAILCUT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
}
