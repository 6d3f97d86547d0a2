//! The `tailcut-bench` command: load benchmarks over the simulated upstream, `hedge` and
//! `overhead`, each running a tailcut server in this process through the `tailcut` library.
//!
//! A crate of its own so the server binary links neither these nor plotters.

mod hedge;
mod overhead;
mod plot;
mod process;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// What the gateway itself costs: added TTFT and memory per open stream and WebSocket.
    Overhead(overhead::OverheadArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tailcut-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Hedge(args) => hedge::hedge(args).await,
            Command::Overhead(args) => overhead::overhead(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tailcut-bench: {e}");
            ExitCode::FAILURE
        }
    }
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
