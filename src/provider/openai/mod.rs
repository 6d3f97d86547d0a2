//! The OpenAI Chat Completions adapter (also any OpenAI-compatible server): POSTs a
//! streaming request to `{base_url}/chat/completions` and turns the SSE answer into `Delta`s.

mod request;
mod stream;
mod types;

use std::fmt;

use futures::future::BoxFuture;
use http::header::AUTHORIZATION;
use http::Request;

use crate::provider::client::RequestBody;
use crate::provider::http::Endpoint;
use crate::provider::{DeltaStream, HttpClient, Provider, ProviderError, UpstreamRequest};
use crate::types::{ModelRules, Wire};

pub struct OpenAiProvider {
    /// Its base URL includes the version prefix, e.g. `https://api.openai.com/v1`.
    endpoint: Endpoint,
    rules: ModelRules,
}

impl OpenAiProvider {
    /// A route's adapter, with its model's rules (`ModelRules::for_model` unless the route's
    /// config says otherwise).
    pub fn new(base_url: String, model: String, api_key: Option<String>, client: HttpClient) -> Self {
        let rules = ModelRules::for_model(Wire::OpenAi, &model);
        OpenAiProvider::with_rules(base_url, model, api_key, client, rules)
    }

    pub fn with_rules(
        base_url: String,
        model: String,
        api_key: Option<String>,
        client: HttpClient,
        rules: ModelRules,
    ) -> Self {
        OpenAiProvider {
            endpoint: Endpoint::new(base_url, model, api_key, client),
            rules,
        }
    }

    /// One attempt's POST: the body in this wire format, its headers and the route's key.
    fn request(&self, req: &UpstreamRequest) -> Result<Request<RequestBody>, ProviderError> {
        let body = request::body(req, &self.endpoint.model, &self.rules)?;
        let mut request = self.endpoint.post("/chat/completions", &req.request_id, &body)?;
        self.endpoint
            .with_key(&mut request, AUTHORIZATION, |key| format!("Bearer {key}"))?;
        Ok(request)
    }
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.endpoint.debug_as("OpenAiProvider", f)
    }
}

impl Provider for OpenAiProvider {
    fn open(&self, req: UpstreamRequest) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        let committed = req.prefill.as_ref().map_or("", |p| p.text.as_str());
        self.endpoint
            .open(self.request(&req), stream::ChunkDecoder::default(), committed)
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

    const TEXT: &str = include_str!("../../../tests/fixtures/openai/text.sse");

    fn request() -> UpstreamRequest {
        hello("req-42")
    }

    fn provider(server: &ReplayServer, key: Option<&str>) -> OpenAiProvider {
        OpenAiProvider::new(
            format!("{}/v1/", server.base),
            "gpt-4o-mini".into(),
            key.map(str::to_string),
            http_client(),
        )
    }

    async fn open_err(reply: Reply) -> ProviderError {
        let server = ReplayServer::start(reply).await;
        match provider(&server, Some("sk-test")).open(request()).await {
            Ok(_) => panic!("a non-2xx answer must not open a stream"),
            Err(e) => e,
        }
    }

    #[tokio::test]
    async fn streams_a_fixture_over_http_with_the_right_request() {
        let server = ReplayServer::start(Reply::sse(TEXT)).await;
        let stream = provider(&server, Some("sk-test"))
            .open(request())
            .await
            .expect("stream opens");
        let out: Vec<_> = stream.collect().await;
        let first_text = out.iter().find(|d| matches!(d, Ok(Delta::Text(_))));
        assert_eq!(first_text, Some(&Ok(Delta::Text("I'm".into()))));
        assert!(out.contains(&Ok(Delta::Finish(FinishReason::Stop))), "{out:?}");
        let recorded = server.requests.lock().clone();
        assert_eq!(recorded.len(), 1);
        let seen = &recorded[0];
        assert_eq!(seen.path, "/v1/chat/completions");
        assert_eq!(seen.headers["authorization"], "Bearer sk-test");
        assert_eq!(seen.headers["x-request-id"], "req-42");
        assert_eq!(seen.headers["accept"], "text/event-stream");
        assert_eq!(seen.body["model"], "gpt-4o-mini");
        assert_eq!(seen.body["stream"], true);
    }

    #[tokio::test]
    async fn no_key_means_no_authorization_header() {
        let server = ReplayServer::start(Reply::sse(TEXT)).await;
        let stream = provider(&server, None).open(request()).await.expect("stream opens");
        drop(stream);
        let recorded = server.requests.lock().clone();
        assert!(
            recorded[0].headers.get("authorization").is_none(),
            "keyless local servers get no header"
        );
    }

    #[tokio::test]
    async fn rate_limit_at_open_carries_retry_after() {
        let body = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        let e = open_err(Reply::error(429, &[("retry-after", "3")], body)).await;
        assert_eq!((e.class, e.status), (ErrorClass::RateLimited, Some(429)));
        assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(
            e.message, "upstream answered 429: rate limited; upstream said: \"Rate limit reached\"",
            "our words, then the upstream's"
        );
        let e = open_err(Reply::error(
            429,
            &[("retry-after-ms", "1500"), ("retry-after", "9")],
            body,
        ))
        .await;
        assert_eq!(e.retry_after, Some(Duration::from_millis(1500)), "retry-after-ms first");
    }

    #[tokio::test]
    async fn auth_and_server_errors_at_open_are_classified() {
        let e = open_err(Reply::error(
            401,
            &[],
            r#"{"error":{"message":"Incorrect API key provided"}}"#,
        ))
        .await;
        assert_eq!(e.class, ErrorClass::Auth);
        let e = open_err(Reply::error(503, &[], "upstream connect error")).await;
        assert_eq!(e.class, ErrorClass::Unavailable);
        assert_eq!(
            e.message, "upstream answered 503: unavailable; upstream said: \"upstream connect error\"",
            "non-JSON bodies are quoted as text"
        );
    }

    #[tokio::test]
    async fn dropping_the_stream_closes_the_upstream_connection() {
        let mut reply = Reply::sse("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n");
        reply.hold_open = true;
        let server = ReplayServer::start(reply).await;
        let mut stream = provider(&server, None).open(request()).await.expect("stream opens");
        assert_eq!(stream.next().await, Some(Ok(Delta::Text("a".into()))));
        drop(stream);
        tokio::time::timeout(Duration::from_secs(10), server.body_dropped())
            .await
            .expect("the server sees the connection close once the stream is dropped");
    }

    #[tokio::test]
    async fn unreachable_upstream_is_unavailable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
        drop(listener);
        let provider = OpenAiProvider::new(base, "m".into(), None, http_client());
        let e = provider.open(request()).await.err().expect("nothing listens");
        assert_eq!(e.class, ErrorClass::Unavailable, "{e}");
    }
}
