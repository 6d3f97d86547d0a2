//! The servers under test, each in a process of its own so that its memory, CPU time and
//! allocations are its own: tailcut (the library's `server::start` over a config file) or
//! the bare pass-through proxy. The benchmark starts this same binary as
//! `tailcut-bench server KIND ...`; the child prints one `ready` line and then answers a
//! `stat` (or `stat trim`) line on stdin with a JSON [`Stat`] line on stdout, until stdin
//! closes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpListener;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::process::{self, Stat};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Tailcut,
    Bare,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    #[arg(value_enum)]
    pub kind: Kind,
    /// tailcut: its config file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// bare: the upstream's address (host:port); every request is relayed there as is.
    #[arg(long)]
    pub upstream: Option<SocketAddr>,
    /// bare: read/write buffer of its WebSocket baseline, as tailcut's `server.ws.buffer_bytes`.
    #[arg(long, default_value_t = 8192)]
    pub ws_buffer: usize,
    /// bare: reach the upstream over HTTP/2 with prior knowledge (h2c).
    #[arg(long)]
    pub h2c: bool,
}

/// The child side: serve, say where, answer `stat` lines until stdin closes.
pub async fn serve(args: ServerArgs) -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let http = listener.local_addr().map_err(|e| e.to_string())?;
    // Kept alive until stdin closes.
    let mut _running = None;
    let ws = match args.kind {
        Kind::Tailcut => {
            let path = args.config.ok_or("tailcut needs --config")?;
            let config = tailcut::config::load_file(&path).map_err(|e| e.to_string())?;
            _running = Some(
                tailcut::server::start(config, listener)
                    .await
                    .map_err(|e| e.to_string())?,
            );
            http
        }
        Kind::Bare => {
            let upstream = args.upstream.ok_or("bare needs --upstream")?;
            tokio::spawn(crate::bare::serve(listener, upstream, args.h2c));
            let ws_listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
            let ws = ws_listener.local_addr().map_err(|e| e.to_string())?;
            tokio::spawn(crate::bare::serve_ws(ws_listener, args.ws_buffer));
            ws
        }
    };
    let mut stdout = tokio::io::stdout();
    let say = |line: String| line + "\n";
    stdout
        .write_all(say(format!("ready {http} {ws}")).as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    stdout.flush().await.map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let trim = line.trim() == "stat trim";
        let reply = match process::read(trim) {
            Ok(stat) => serde_json::to_string(&stat).map_err(|e| e.to_string())?,
            Err(e) => serde_json::json!({ "error": e }).to_string(),
        };
        stdout
            .write_all(say(reply).as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        stdout.flush().await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The parent side: a server process started by the benchmark.
pub struct Server {
    /// Where its HTTP side listens.
    pub http: SocketAddr,
    /// Where its WebSockets are accepted (tailcut: the same port, path `/v1/ws`).
    pub ws: SocketAddr,
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Server {
    /// Starts `kind` as a child process of this binary; the bare proxy reaches `upstream` over
    /// HTTP/2 with prior knowledge when `h2c` (tailcut's config says so itself).
    pub async fn start(
        kind: Kind,
        config: Option<&std::path::Path>,
        upstream: SocketAddr,
        h2c: bool,
    ) -> Result<Server, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        // TAILCUT_BENCH_WRAP runs the tailcut server under a tool, e.g.
        // "valgrind --tool=callgrind --callgrind-out-file=tailcut.callgrind".
        let wrap = std::env::var("TAILCUT_BENCH_WRAP")
            .ok()
            .filter(|_| kind == Kind::Tailcut);
        let mut words = wrap.as_deref().unwrap_or("").split_whitespace();
        let mut command = match words.next() {
            Some(tool) => {
                let mut c = Command::new(tool);
                c.args(words).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        command.arg("server");
        match kind {
            Kind::Tailcut => {
                let config = config.ok_or("tailcut needs a config")?;
                command.arg("tailcut").arg("--config").arg(config);
            }
            Kind::Bare => {
                command.arg("bare").arg("--upstream").arg(upstream.to_string());
                if h2c {
                    command.arg("--h2c");
                }
            }
        }
        let mut child = command
            .env(
                "TAILCUT_LOG",
                std::env::var("TAILCUT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start the {kind:?} server: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin pipe")?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let mut stdout = BufReader::new(stdout).lines();
        let ready = stdout
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("the {kind:?} server exited before it was ready"))?;
        let (http, ws) = parse_ready(&ready).ok_or_else(|| format!("unexpected first line {ready:?}"))?;
        Ok(Server {
            http,
            ws,
            child,
            stdin,
            stdout,
        })
    }

    /// Reads the server process; `trim` hands its freed heap back to the OS first.
    pub async fn stat(&mut self, trim: bool) -> Result<Stat, String> {
        let ask = if trim { "stat trim\n" } else { "stat\n" };
        self.stdin.write_all(ask.as_bytes()).await.map_err(|e| e.to_string())?;
        self.stdin.flush().await.map_err(|e| e.to_string())?;
        let line = self
            .stdout
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the server process exited")?;
        serde_json::from_str(&line).map_err(|e| format!("bad stat line {line:?}: {e}"))
    }

    pub async fn stop(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.child.wait()).await;
        let _ = self.child.kill().await;
    }
}

fn parse_ready(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let mut words = line.split_whitespace();
    (words.next()? == "ready").then_some(())?;
    Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_names_both_addresses() {
        let (http, ws) = parse_ready("ready 127.0.0.1:1 127.0.0.1:2").expect("parses");
        assert_eq!((http.port(), ws.port()), (1, 2));
        assert!(parse_ready("listening 127.0.0.1:1 127.0.0.1:2").is_none());
        assert!(parse_ready("ready 127.0.0.1:1").is_none());
    }
}
