//! The `tailcut` command: `serve` (default), `sim`, `check-config`, `keys new`. The
//! benchmarks are the `tailcut-bench` command (bench/), so this binary does not carry them.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tailcut::config::{self, Config, ConfigError, Severity};

/// Shown under every command's --help.
const ENVIRONMENT: &str = "Environment:
  TAILCUT_LOG         log filter, tracing's EnvFilter syntax (default: info),
                      e.g. TAILCUT_LOG=debug or TAILCUT_LOG=info,tailcut::mux=debug
  TAILCUT_LOG_FORMAT  json: one JSON object per line; anything else: text
                      (ANSI colours only when stdout is a terminal and NO_COLOR is unset)
  Each *_env key of the config (api_key_env, admin_token_env, token_secret_env) names a
  variable read at start; `tailcut check-config FILE` says which are unset.";

#[derive(Parser)]
#[command(name = "tailcut", version, about = "A streaming-first LLM edge server", after_help = ENVIRONMENT)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve chat requests (the default; with no --config, the embedded simulated routes).
    #[command(after_help = ENVIRONMENT)]
    Serve {
        /// The config file [default: the embedded config/default.toml: simulated routes, no keys].
        /// A file with `extends = "default"` changes only the keys it names.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Listen here instead of `server.listen` [default: the config's, 127.0.0.1:8080 in the
        /// embedded one]: IP:PORT or HOST:PORT (the host name is resolved, e.g. localhost:8080).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Serve a non-loopback address with no [auth] (as `server.allow_unauthenticated`)
        /// [default: off].
        #[arg(long)]
        allow_unauthenticated: bool,
        /// A browser origin allowed to call the API (adds to `[server.cors] allowed_origins`;
        /// repeatable), e.g. the public address the embedded playground is served at
        /// [default: none besides the config's].
        #[arg(long = "allow-origin", value_name = "ORIGIN")]
        allow_origins: Vec<String>,
    },
    /// Run the simulated upstream alone.
    #[command(after_help = ENVIRONMENT)]
    Sim {
        /// Where the simulated upstream listens.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9101")]
        listen: SocketAddr,
        /// A config file whose [sim.scenarios.*] are served besides the built-in profiles
        /// [default: the built-in profiles only].
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Validate a config file: every problem at once, each under its key path, and every
    /// *_env variable it names that is unset. Exits 1 on any error.
    #[command(after_help = ENVIRONMENT)]
    CheckConfig {
        /// The config file to check.
        file: PathBuf,
        /// Unset *_env variables are warnings, not errors (the file is checked away from
        /// the environment it will run in) [default: off].
        #[arg(long)]
        offline: bool,
    },
    /// Run an eval set (JSON lines) against every route; write per-route, per-task scores.
    Eval {
        /// The config whose routes are scored (default: the embedded simulated routes).
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        set: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
    /// Client keys for `[auth]`.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// A fresh random key, printed once on stderr, and its `[[auth.keys]]` lines (only its
    /// SHA-256) on stdout: `tailcut keys new --tenant T >> tailcut.toml`.
    New {
        /// The `[tenants.*]` entry the key serves as.
        #[arg(long)]
        tenant: String,
        /// The key's name in logs and tokens (default: `<tenant>-<8 hex of its hash>`).
        #[arg(long)]
        name: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Keys {
        command: KeysCommand::New { tenant, name },
    }) = &cli.command
    {
        return new_key(tenant, name.as_deref());
    }
    // `eval` prints its table on stdout, so its log lines go to stderr.
    init_tracing(matches!(cli.command, Some(Command::Eval { .. })));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tailcut: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match cli.command.unwrap_or(Command::Serve {
            config: None,
            listen: None,
            allow_unauthenticated: false,
            allow_origins: Vec::new(),
        }) {
            Command::Serve {
                config,
                listen,
                allow_unauthenticated,
                allow_origins,
            } => serve(config, listen, allow_unauthenticated, &allow_origins).await,
            Command::Sim { listen, config } => sim(listen, config).await,
            Command::CheckConfig { file, offline } => check_config(&file, offline),
            Command::Eval {
                config,
                set,
                out,
                concurrency,
            } => match tailcut::eval::command(config.as_deref(), &set, &out, concurrency).await {
                Ok(scores) => {
                    print!("{}", scores.table());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("tailcut eval: {e}");
                    ExitCode::FAILURE
                }
            },
            Command::Keys { .. } => ExitCode::SUCCESS,
        }
    })
}

fn init_tracing(to_stderr: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TAILCUT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = std::env::var("TAILCUT_LOG_FORMAT").is_ok_and(|v| v == "json");
    // Logs go to stdout (stderr for `eval`): colour codes only for a person at a terminal,
    // never in a file.
    let terminal = if to_stderr {
        std::io::stderr().is_terminal()
    } else {
        std::io::stdout().is_terminal()
    };
    let ansi = terminal && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(move || -> Box<dyn std::io::Write> {
            if to_stderr {
                Box::new(std::io::stderr())
            } else {
                Box::new(std::io::stdout())
            }
        });
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn load(path: Option<&PathBuf>) -> Result<Config, ConfigError> {
    match path {
        Some(p) => config::load_file(p),
        None => config::load_str(config::DEFAULT_TOML),
    }
}

async fn serve(
    path: Option<PathBuf>,
    listen: Option<String>,
    allow_unauthenticated: bool,
    allow_origins: &[String],
) -> ExitCode {
    let mut config = match load(path.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tailcut: {e}");
            return ExitCode::FAILURE;
        }
    };
    let missing: Vec<_> = config::missing_env(&config)
        .into_iter()
        .filter(|(severity, _)| *severity == Severity::Error)
        .collect();
    if !missing.is_empty() {
        for (_, problem) in &missing {
            eprintln!("tailcut: {problem}");
        }
        return ExitCode::FAILURE;
    }
    if let Some(text) = listen {
        match config::resolve_addr(&text) {
            Ok(addr) => config.server.listen = addr,
            Err(why) => {
                eprintln!("tailcut: --listen {why}");
                return ExitCode::from(2);
            }
        }
    }
    config.server.allow_unauthenticated |= allow_unauthenticated;
    for origin in allow_origins {
        match config::normalize_origin(origin) {
            Ok(o) if !config.server.cors_allowed_origins.contains(&o) => config.server.cors_allowed_origins.push(o),
            Ok(_) => {}
            Err(why) => {
                eprintln!("tailcut: --allow-origin {origin:?}: {why}");
                return ExitCode::from(2);
            }
        }
    }
    let listener = match tokio::net::TcpListener::bind(config.server.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tailcut: cannot listen on {}: {e}", config.server.listen);
            return ExitCode::FAILURE;
        }
    };
    let running = match tailcut::server::start(config, listener).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tailcut: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(sim) = &running.sim {
        tracing::info!(addr = %sim.addr(), "simulated upstream listening");
    }
    tracing::info!(addr = %running.addr, "tailcut listening; try: curl -N {}/v1/chat/completions", running.url(""));
    shutdown_signal().await;
    tracing::info!("shutdown requested: draining (a second signal exits at once)");
    tokio::select! {
        _ = running.shutdown() => {}
        _ = shutdown_signal() => tracing::warn!("second shutdown signal: exiting without finishing the drain"),
    }
    ExitCode::SUCCESS
}

async fn sim(listen: SocketAddr, path: Option<PathBuf>) -> ExitCode {
    let scenarios = match path.as_deref().map(config::load_file).transpose() {
        Ok(c) => c.map(|c| c.sim.scenarios).unwrap_or_default(),
        Err(e) => {
            eprintln!("tailcut: {e}");
            return ExitCode::FAILURE;
        }
    };
    match tailcut::sim::serve_standalone(listen, scenarios).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tailcut sim: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `tailcut keys new`: the config lines on stdout (safe to append to a file), the key itself
/// on stderr, so it lands on the terminal and never in the file.
fn new_key(tenant: &str, name: Option<&str>) -> ExitCode {
    match tailcut::transport::auth::keygen::new_key(tenant, name) {
        Ok(new) => {
            print!("{}", new.toml);
            eprintln!("{}", new.key);
            eprintln!(
                "(the key above is shown only now: give it to the client; the [[auth.keys]] lines on stdout hold only its SHA-256)"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tailcut keys new: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One line per finding, `FILE: error|warning: key.path: message`, then a summary line;
/// "ok" only when nothing is an error.
fn check_config(file: &std::path::Path, offline: bool) -> ExitCode {
    let name = file.display();
    let (config, mut errors) = match config::check_file(file) {
        Ok((config, problems)) => {
            for p in &problems {
                eprintln!("{name}: error: {p}");
            }
            (config, problems.len())
        }
        Err(e) => {
            eprintln!("{name}: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut warnings = 0usize;
    // Checked even when the file has other problems: every missing secret at once.
    if let Some(c) = &config {
        for (severity, problem) in config::missing_env(c) {
            if severity == Severity::Error && !offline {
                errors += 1;
                eprintln!("{name}: error: {problem}");
            } else {
                warnings += 1;
                eprintln!("{name}: warning: {problem}");
            }
        }
    }
    match (&config, errors) {
        (Some(c), 0) => {
            println!(
                "{name}: ok ({} routes, {} models, {warnings} warning(s))",
                c.routes.len(),
                c.models.len()
            );
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{name}: {errors} error(s), {warnings} warning(s)");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
