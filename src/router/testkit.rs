//! Fixtures for the router's unit tests: a small fleet across regions, rungs and pools.

use crate::config::{load_str, Config};
use crate::types::{ChatRequest, Message, Role};

/// Five routes behind model `chat`; `model_extra` adds keys to `[models.chat]`.
pub fn config(model_extra: &str) -> Config {
    let text = format!(
        r#"
        [[routes]]
        name = "eu-a"
        provider = "simulated"
        region = "eu"
        level = "L0"
        data_terms = ["no_retention"]
        cost_per_1k = 0.002
        context_window = 8000
        max_output = 2000
        quality = {{ chat = 0.9, code = 0.8 }}

        [[routes]]
        name = "eu-fast"
        provider = "simulated"
        region = "eu"
        level = "L0"
        data_terms = ["no_retention"]
        quality = {{ chat = 0.85 }}

        [[routes]]
        name = "eu-b"
        provider = "simulated"
        wire = "anthropic"
        region = "eu"
        level = "L1"
        min_useful_ms = 1500
        quality = {{ chat = 0.8 }}

        [[routes]]
        name = "us-c"
        provider = "simulated"
        region = "us"
        level = "L2"
        capabilities = ["streaming"]
        quality = {{ "*" = 0.6 }}

        [[routes]]
        name = "eu-batch"
        provider = "simulated"
        region = "eu"
        level = "L2"
        pools = ["batch"]
        quality = {{ chat = 0.9 }}

        [models.chat]
        routes = ["eu-a", "eu-fast", "eu-b", "us-c", "eu-batch"]
        {model_extra}

        [tenants.acme]
        region = "eu"
        data_terms = ["no_retention"]
        "#
    );
    match load_str(&text) {
        Ok(c) => c,
        Err(e) => panic!("test config must validate: {e}"),
    }
}

pub fn request(text: &str) -> ChatRequest {
    ChatRequest {
        model: "chat".into(),
        messages: vec![Message::text(Role::User, text)],
        ..ChatRequest::default()
    }
}
