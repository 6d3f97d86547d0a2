//! The Anthropic Messages adapter: POSTs a streaming request to `{base_url}/v1/messages` and
//! turns the SSE answer into `Delta`s.

mod request;
mod stream;
mod types;

use std::fmt;

use futures::future::BoxFuture;
use http::header::{HeaderName, HeaderValue};
use http::Request;

pub use request::DEFAULT_MAX_TOKENS;

use crate::provider::client::RequestBody;
use crate::provider::http::Endpoint;
use crate::provider::{DeltaStream, HttpClient, Provider, ProviderError, UpstreamRequest};
use crate::types::{ModelRules, Wire};

/// The API version this adapter speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

pub struct AnthropicProvider {
    /// Its base URL is the host root, e.g. `https://api.anthropic.com`.
    endpoint: Endpoint,
    rules: ModelRules,
}

impl AnthropicProvider {
    pub fn new(base_url: String, model: String, api_key: Option<String>, client: HttpClient) -> Self {
        let rules = ModelRules::for_model(Wire::Anthropic, &model);
        AnthropicProvider::with_rules(base_url, model, api_key, client, rules)
    }

    /// A route's adapter with its model's rules (the route's config may override the family's).
    pub fn with_rules(
        base_url: String,
        model: String,
        api_key: Option<String>,
        client: HttpClient,
        rules: ModelRules,
    ) -> Self {
        AnthropicProvider {
            endpoint: Endpoint::new(base_url, model, api_key, client),
            rules,
        }
    }

    /// One attempt's POST: the body in this wire format, its headers and the route's key. A
    /// client of this wire has its `anthropic-beta` header forwarded: the features it turns
    /// on (interleaved thinking, a longer context, files) change what the body means.
    fn request(&self, req: &UpstreamRequest) -> Result<Request<RequestBody>, ProviderError> {
        let body = request::body(req, &self.endpoint.model, &self.rules)?;
        let mut request = self.endpoint.post("/v1/messages", &req.request_id, &body)?;
        request.headers_mut().insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        let beta = req
            .chat
            .verbatim
            .as_deref()
            .filter(|v| v.wire == Wire::Anthropic)
            .and_then(|v| v.header("anthropic-beta"))
            .and_then(|b| HeaderValue::from_str(b).ok());
        if let Some(beta) = beta {
            request
                .headers_mut()
                .insert(HeaderName::from_static("anthropic-beta"), beta);
        }
        self.endpoint
            .with_key(&mut request, HeaderName::from_static("x-api-key"), str::to_string)?;
        Ok(request)
    }
}

impl fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.endpoint.debug_as("AnthropicProvider", f)
    }
}

impl Provider for AnthropicProvider {
    fn open(&self, req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        let committed = req.prefill.as_ref().map_or("", |p| p.text.as_str());
        self.endpoint
            .open(self.request(&req), stream::EventDecoder::default(), committed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;
    use crate::provider::testkit::{hello, ReplayServer, Reply};
    use crate::provider::{http_client, Delta, ErrorClass};
    use crate::types::FinishReason;

    const TOOL_USE: &str = include_str!("../../../tests/fixtures/anthropic/tool_use.sse");

    fn request() -> UpstreamRequest {
        hello("req-7")
    }

    fn provider(server: &ReplayServer) -> AnthropicProvider {
        AnthropicProvider::new(
            server.base.clone(),
            "claude-x".into(),
            Some("sk-ant".into()),
            http_client(),
        )
    }

    #[tokio::test]
    async fn streams_a_fixture_over_http_with_the_right_request() {
        let server = ReplayServer::start(Reply::sse(TOOL_USE)).await;
        let stream = provider(&server).open(request()).await.expect("stream opens");
        let out: Vec<_> = stream.collect().await;
        assert!(out.contains(&Ok(Delta::ToolEnd { index: 1 })), "{out:?}");
        assert!(out.contains(&Ok(Delta::Finish(FinishReason::ToolCalls))));
        let recorded = server.requests.lock().clone();
        let seen = &recorded[0];
        assert_eq!(seen.path, "/v1/messages");
        assert_eq!(seen.headers["x-api-key"], "sk-ant");
        assert_eq!(seen.headers["anthropic-version"], ANTHROPIC_VERSION);
        assert_eq!(seen.headers["x-request-id"], "req-7");
        assert_eq!(seen.body["model"], "claude-x");
        assert_eq!(seen.body["max_tokens"], DEFAULT_MAX_TOKENS);
    }

    #[tokio::test]
    async fn overloaded_529_at_open_is_unavailable_with_retry_after() {
        let body =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#;
        let server = ReplayServer::start(Reply::error(529, &[("retry-after", "4")], body)).await;
        let e = provider(&server)
            .open(request())
            .await
            .err()
            .expect("529 does not open");
        assert_eq!((e.class, e.status), (ErrorClass::Unavailable, Some(529)));
        assert_eq!(e.retry_after, Some(Duration::from_secs(4)));
        assert_eq!(
            e.message, "upstream answered 529: unavailable; upstream said: \"Overloaded\"",
            "our words, then the upstream's"
        );
    }

    #[tokio::test]
    async fn dropping_the_stream_closes_the_upstream_connection() {
        let head = TOOL_USE
            .split("event: content_block_stop")
            .next()
            .unwrap_or("")
            .to_string();
        let mut reply = Reply::sse(&head);
        reply.hold_open = true;
        let server = ReplayServer::start(reply).await;
        let mut stream = provider(&server).open(request()).await.expect("stream opens");
        assert_eq!(stream.next().await, Some(Ok(Delta::Text("I".into()))));
        drop(stream);
        tokio::time::timeout(Duration::from_secs(10), server.body_dropped())
            .await
            .expect("the server sees the connection close once the stream is dropped");
    }
}
