//! A throwaway `redis-server` for tests: started on a free loopback port without persistence
//! (`--save "" --appendonly no`), killed and restarted on the same port mid-test.
//!
//! Include it with `#[path = "support/redis.rs"] mod redis_server;`. A missing `redis-server`
//! is a test failure that says how to install it, never a silent skip.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a started `redis-server` may take to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// One `redis-server` child process on `127.0.0.1:port`. Killed when dropped.
pub struct RedisServer {
    port: u16,
    binary: PathBuf,
    child: Option<Child>,
}

/// The `redis-server` binary: `$REDIS_SERVER`, else `/usr/bin/redis-server`, else the first on
/// `PATH`. Panics with install instructions when there is none.
pub fn redis_server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("REDIS_SERVER").map(PathBuf::from) {
        if p.is_file() {
            return p;
        }
    }
    let usr = PathBuf::from("/usr/bin/redis-server");
    if usr.is_file() {
        return usr;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("redis-server");
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "redis-server is not installed, and this test needs it: install it \
         (Debian/Ubuntu: `apt-get install redis-server`; macOS: `brew install redis`) \
         or set REDIS_SERVER to its path"
    );
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    listener.local_addr().expect("local addr").port()
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port and waits until it answers `PING`.
    pub fn start() -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            binary: redis_server_binary(),
            child: None,
        };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id while it runs (for CPU accounting in measurements).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (SIGKILL, as a crash would) and waits for it to exit. Its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a fresh, empty server on the same port (after `kill`) and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends one inline command (`PING`, `DBSIZE`, `FLUSHALL`, `KEYS *`...) and returns the
    /// raw reply, read until the reply looks complete (at most about a second).
    pub fn command(&self, line: &str) -> String {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
            return String::new();
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        if stream.write_all(format!("{line}\r\n").as_bytes()).is_err() {
            return String::new();
        }
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        // At most five reads of up to 200 ms each.
        for _ in 0..5 {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    reply.extend_from_slice(&buf[..n]);
                    if reply_complete(&reply) {
                        break;
                    }
                }
                Err(_) => {
                    if !reply.is_empty() {
                        break;
                    }
                }
            }
        }
        String::from_utf8_lossy(&reply).into_owned()
    }

    /// Whether the server answers `PING` now.
    pub fn answers(&self) -> bool {
        self.command("PING").starts_with("+PONG")
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.child = Some(child);
        // A refused connection fails at once, so this is about READY_WITHIN in all.
        let attempts = READY_WITHIN.as_millis() / 20;
        for _ in 0..attempts {
            if self.answers() {
                return;
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    panic!("redis-server on port {} exited at start: {status}", self.port);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on port {} did not answer PING within {READY_WITHIN:?}",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A RESP reply is complete when its last line ends; good enough for the simple replies and
/// flat arrays the tests ask for.
fn reply_complete(reply: &[u8]) -> bool {
    if !reply.ends_with(b"\r\n") {
        return false;
    }
    match reply.first() {
        Some(b'+' | b'-' | b':') => true,
        Some(b'$') => {
            let text = String::from_utf8_lossy(reply);
            let mut lines = text.split("\r\n");
            let len: i64 = lines.next().and_then(|l| l[1..].parse().ok()).unwrap_or(-1);
            len < 0 || lines.next().is_some_and(|l| l.len() as i64 >= len)
        }
        Some(b'*') => {
            let text = String::from_utf8_lossy(reply);
            let n: i64 = text.split("\r\n").next().and_then(|l| l[1..].parse().ok()).unwrap_or(0);
            // Each element of a flat array of bulk strings is two lines.
            n <= 0 || text.matches("\r\n").count() as i64 > 2 * n
        }
        _ => true,
    }
}
