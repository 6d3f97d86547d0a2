//! A `tailcut serve` child process for the two-instance tests: its config written to a
//! temporary file, a free loopback port, started and waited for (bounded), killed when
//! dropped; and the plain-HTTP client the tests talk to it with.
#![allow(dead_code)] // each test file uses part of it

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One running `tailcut serve`.
pub struct Instance {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Instance {
    /// Starts `tailcut serve` on `config` with `env` set, and waits (30 s at most) until `GET
    /// ready_path` answers 200 and, with `ready_body`, exactly that body.
    pub async fn spawn(
        config: &str,
        name: &str,
        env: &[(&str, &str)],
        ready_path: &str,
        ready_body: Option<&str>,
    ) -> Instance {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("tailcut.toml");
        let mut file = std::fs::File::create(&path).expect("config file");
        file.write_all(config.as_bytes()).expect("write config");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_tailcut"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tailcut");
        let instance = Instance {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        for _ in 0..300 {
            if let Ok(resp) = client().get(instance.url(ready_path)).send().await {
                if resp.status() == 200 {
                    let body = resp.text().await.unwrap_or_default();
                    if ready_body.is_none_or(|want| body == want) {
                        return instance;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("tailcut instance {name} was not ready ({ready_path}) within 30 s");
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client for plain HTTP on loopback.
pub fn client() -> reqwest::Client {
    // Plain HTTP only, but reqwest wants a TLS provider chosen before building a client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .build()
        .expect("client")
}
