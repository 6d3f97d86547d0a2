//! An upstream's HTTP endpoint and the steps every adapter takes to open a stream on it:
//! the streaming POST, the route's key as a sensitive header, the send, the status
//! classification, and the body handed to a wire decoder.

use std::fmt;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, Request, Uri};
use http_body_util::{BodyDataStream, Full};
use serde::Serialize;

use super::client::{HttpClient, RequestBody};
use super::{classify_response, classify_transport, drive, DeltaStream, ErrorClass, ProviderError, WireDecoder};

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Where one route's requests go and who they go as.
pub(crate) struct Endpoint {
    /// The root that request paths are appended to, without a trailing `/`.
    pub base_url: String,
    /// The upstream's model id.
    pub model: String,
    api_key: Option<String>,
    client: HttpClient,
}

impl Endpoint {
    pub fn new(base_url: String, model: String, api_key: Option<String>, client: HttpClient) -> Self {
        let base_url = base_url.trim_end_matches('/').to_string();
        Endpoint {
            base_url,
            model,
            api_key,
            client,
        }
    }

    /// A streaming POST of `body` (serialized once, into the bytes sent) to
    /// `{base_url}{path}`, correlated by `x-request-id`.
    pub fn post(
        &self,
        path: &str,
        request_id: &str,
        body: &impl Serialize,
    ) -> Result<Request<RequestBody>, ProviderError> {
        let uri: Uri = format!("{}{path}", self.base_url)
            .parse()
            .map_err(|_| unbuildable("the route's base_url does not make a valid URL"))?;
        let request_id =
            HeaderValue::from_str(request_id).map_err(|_| unbuildable("the request id is not a valid header value"))?;
        let body = serde_json::to_vec(body).map_err(|e| unbuildable(&format!("the body did not serialize: {e}")))?;
        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(X_REQUEST_ID, request_id);
        Ok(request)
    }

    /// Adds the route's key, if it has one, as the sensitive header `name` whose value
    /// `render` makes from the key. A key that cannot be a header value is an auth error.
    pub fn with_key(
        &self,
        request: &mut Request<RequestBody>,
        name: HeaderName,
        render: impl FnOnce(&str) -> String,
    ) -> Result<(), ProviderError> {
        let Some(key) = &self.api_key else {
            return Ok(());
        };
        let mut value = HeaderValue::from_str(&render(key))
            .map_err(|_| ProviderError::new(ErrorClass::Auth, "the route's api key is not a valid header value"))?;
        // Never indexed by HTTP/2's header compression, and shown as `Sensitive` by `Debug`.
        value.set_sensitive(true);
        request.headers_mut().insert(name, value);
        Ok(())
    }

    /// Sends a prepared request and, once the upstream answers 2xx, runs `decoder` over
    /// its body. A request that could not be prepared, a transport failure and a non-2xx
    /// answer all resolve to a classified `Err`.
    pub fn open<D: WireDecoder>(
        &self,
        request: Result<Request<RequestBody>, ProviderError>,
        decoder: D,
    ) -> BoxFuture<'static, Result<DeltaStream, ProviderError>> {
        let sent = request.map(|request| self.client.request(request));
        Box::pin(async move {
            let response = sent?.await.map_err(|e| classify_transport(&e))?;
            if !response.status().is_success() {
                return Err(classify_response(response).await);
            }
            Ok(drive(BodyDataStream::new(response.into_body()), decoder))
        })
    }

    /// The fields of an adapter's `Debug`, with the key redacted.
    pub fn debug_as(&self, adapter: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(adapter)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

fn unbuildable(why: &str) -> ProviderError {
    ProviderError::new(
        ErrorClass::Internal,
        format!("could not build the upstream request: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::http_client;

    fn endpoint(key: Option<&str>) -> Endpoint {
        Endpoint::new(
            "http://127.0.0.1:0/v1/".into(),
            "m".into(),
            key.map(str::to_string),
            http_client(),
        )
    }

    #[test]
    fn the_base_url_loses_its_trailing_slash() {
        assert_eq!(
            endpoint(None).base_url,
            "http://127.0.0.1:0/v1",
            "paths are appended to the root"
        );
    }

    #[test]
    fn a_key_that_is_not_a_header_value_is_an_auth_error() {
        let e = endpoint(Some("bad\nkey"));
        let mut request = e.post("/x", "req-1", &serde_json::json!({})).expect("builds");
        let err = e
            .with_key(&mut request, http::header::AUTHORIZATION, |k| format!("Bearer {k}"))
            .err()
            .map(|e| e.class);
        assert_eq!(err, Some(ErrorClass::Auth), "a newline cannot go into a header");
    }

    #[test]
    fn debug_never_shows_the_key() {
        struct Shown(Endpoint);
        impl fmt::Debug for Shown {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.debug_as("Adapter", f)
            }
        }
        let shown = format!("{:?}", Shown(endpoint(Some("sk-secret"))));
        assert!(!shown.contains("sk-secret"), "the key is redacted: {shown}");
        assert!(shown.starts_with("Adapter {"), "named after the adapter: {shown}");
    }
}
