//! What every run of `overhead`, `streams` and `hold` stands on: the simulated upstream in
//! this process (on a runtime of its own), and two server processes in front of it, tailcut
//! and the bare pass-through proxy. A request reaches the upstream three ways: straight
//! (`direct`), through the bare proxy (`bare`), through tailcut (`tailcut`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::Serialize;
use tailcut::sim::{Scenario, SimHandle};

use crate::client::{chat_body, Target};
use crate::server::{Kind, Server};

/// The three ways to the same upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Direct,
    Bare,
    Tailcut,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Direct, Mode::Bare, Mode::Tailcut];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Bare => "bare",
            Mode::Tailcut => "tailcut",
        }
    }
}

pub struct Rig {
    pub sim: SimHandle,
    pub tailcut: Server,
    pub bare: Server,
}

impl Rig {
    /// Starts the simulated upstream with `scenarios` and both server processes; tailcut's
    /// config has one route and one model per scenario, of the same name, hedging off. With
    /// `h2c`, both servers reach the upstream over HTTP/2 with prior knowledge (tailcut's
    /// routes set `http2_prior_knowledge`), else over HTTP/1.1.
    pub async fn start(out: &Path, scenarios: BTreeMap<String, Scenario>, h2c: bool) -> Result<Rig, String> {
        Rig::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), out, scenarios, h2c).await
    }

    /// As [`Rig::start`], with the simulated upstream on `listen` (a fixed port, so a peer
    /// proxy started beforehand can be pointed at it).
    pub async fn start_on(
        listen: SocketAddr,
        out: &Path,
        scenarios: BTreeMap<String, Scenario>,
        h2c: bool,
    ) -> Result<Rig, String> {
        let names: Vec<String> = scenarios.keys().cloned().collect();
        // On the upstream's own runtime, so its tasks never run on the client's thread.
        let upstream = crate::upstream().ok_or("no runtime for the simulated upstream")?;
        let sim = upstream
            .spawn(SimHandle::start(listen, scenarios))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot start the simulated upstream: {e}"))?;
        std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
        let config_path = out.join("tailcut-bench.toml");
        std::fs::write(&config_path, config_text(sim.addr(), &names, h2c))
            .map_err(|e| format!("cannot write {}: {e}", config_path.display()))?;
        let tailcut = Server::start(Kind::Tailcut, Some(&config_path), sim.addr(), h2c).await?;
        let bare = Server::start(Kind::Bare, None, sim.addr(), h2c).await?;
        Ok(Rig { sim, tailcut, bare })
    }

    /// How `mode` asks `scenario` for an answer.
    pub fn target(&self, mode: Mode, scenario: &str) -> Target {
        let direct_path = format!("/s/{scenario}/v1/chat/completions");
        let (addr, path) = match mode {
            Mode::Direct => (self.sim.addr(), direct_path),
            Mode::Bare => (self.bare.http, direct_path),
            Mode::Tailcut => (self.tailcut.http, "/v1/chat/completions".to_string()),
        };
        Target {
            addr,
            path,
            body: chat_body(scenario),
            tailcut: mode == Mode::Tailcut,
            bearer: None,
        }
    }

    pub fn server(&mut self, kind: Kind) -> &mut Server {
        match kind {
            Kind::Tailcut => &mut self.tailcut,
            Kind::Bare => &mut self.bare,
        }
    }

    pub async fn stop(self) {
        self.tailcut.stop().await;
        self.bare.stop().await;
        self.sim.shutdown();
    }
}

/// One route per scenario over the OpenAI wire to the simulated upstream (over HTTP/2 with
/// prior knowledge when `h2c`), hedging off, and limits far above anything a benchmark opens.
pub fn config_text(sim: SocketAddr, scenarios: &[String], h2c: bool) -> String {
    let mut text = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nmax_streams = 100000\nmax_connections = 100000\ndeadline_ms = 600000\n\
         [hedge]\nenabled = false\n",
    );
    for name in scenarios {
        text += &format!(
            "[[routes]]\nname = \"{name}\"\nprovider = \"openai\"\nbase_url = \"http://{sim}/s/{name}/v1\"\n\
             model = \"{name}\"\nconcurrency = 100000\nfirst_token_timeout_ms = 300000\nstall_timeout_ms = 300000\n\
             http2_prior_knowledge = {h2c}\n"
        );
    }
    for name in scenarios {
        text += &format!("[models.{name}]\nroutes = [\"{name}\"]\n");
    }
    text
}

/// A scenario from its JSON description (every field has a default).
pub fn scenario(json: serde_json::Value) -> Result<Scenario, String> {
    serde_json::from_value(json).map_err(|e| format!("bad scenario: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_is_valid_tailcut_config() {
        let sim = SocketAddr::from(([127, 0, 0, 1], 9));
        for h2c in [false, true] {
            let text = config_text(sim, &["flat".into(), "held".into()], h2c);
            let config = tailcut::config::load_str(&text).expect("a valid config");
            assert_eq!(config.routes.len(), 2);
            assert!(config.routes.iter().all(|r| r.http2_prior_knowledge == h2c));
            assert!(config.models.contains_key("held"), "a model per scenario");
            assert!(!config.needs_sim(), "the upstream is this process's, not tailcut's own");
        }
    }
}
