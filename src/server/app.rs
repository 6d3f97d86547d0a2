//! The edge service in front of the axum routes: the edge's own refusals as JSON in the
//! caller's dialect, the origin guard and CORS on the API, the body reader, then the routes.
//!
//! One service with a future of its own instead of a stack of `from_fn` layers on the router:
//! each of those boxed a future and cloned the boxed routes beneath it on every request.
//! Order for an API request (every path but the two pages), outermost first:
//! 0. the header-size limit (`head_limit`, every path): a JSON 431 before anything runs,
//!    then the Host rule (`host`): a JSON 400 for an HTTP/1.1 request with no Host or any
//!    with two;
//! 1. the refusals (`Refusals`): a bare 404, 405 or 413 from anything inside becomes JSON,
//!    and any refusal without `x-request-id` gets one;
//! 2. the origin guard (`transport::cors::guard`): a 403 before anything else runs, so a
//!    refused origin's body is never read;
//! 3. tower-http's CORS service (preflights; `Access-Control-Allow-Origin` on every answer,
//!    the body reader's refusals included). A request with no `Origin` that is not a
//!    preflight (`OPTIONS`) skips it: tower-http would only add its constant `Vary` and
//!    `Access-Control-Expose-Headers` to the answer, and those are added here instead
//!    ([`NoOriginHeaders`]), without the header map it builds and drains per request;
//! 4. the body reader (`body::BodyReader`), then the routes (`transport::routes`,
//!    `transport::ops::routes`), under axum's `DefaultBodyLimit` set to the same limit.
//!
//! `GET /` and `GET /dashboard` (the pages) get only step 1.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::routing::future::RouteFuture;
use axum::Router;
use pin_project_lite::pin_project;
use tower_http::cors::{Cors, ResponseFuture as CorsFuture};
use tower_service::Service;

use super::body::{BodyLimits, BodyReader};
use super::reply::{client_request_id, dialect_of, render, request_id, EdgeRefusal};
use super::{head_limit, host};
use crate::transport::cors::{self, Origins};
use crate::transport::{self, AppState};
use crate::types::{Dialect, RequestCtx};

/// The paths served as pages, outside the origin guard and CORS.
const PAGES: [&str; 2] = ["/", "/dashboard"];

/// Every route behind the edge's limits, for a server bound to `local` (its loopback origins
/// are allowed when it is on loopback). One per connection (cloned).
#[derive(Clone)]
pub struct Edge {
    pages: Router,
    api: Cors<BodyReader>,
    origins: Arc<Origins>,
    max_bytes: usize,
    max_header_bytes: usize,
    no_origin: NoOriginHeaders,
}

/// What tower-http's CORS service adds to the answer of a request without `Origin` (and not a
/// preflight): `Vary` (appended) and `Access-Control-Expose-Headers` (set), the same values
/// for every request.
#[derive(Clone)]
pub struct NoOriginHeaders {
    vary: HeaderValue,
    expose: HeaderValue,
}

impl NoOriginHeaders {
    fn new() -> Self {
        NoOriginHeaders {
            // tower-http's default `Vary`: the request headers a preflight answer depends on.
            vary: HeaderValue::from_static("origin, access-control-request-method, access-control-request-headers"),
            expose: HeaderValue::from_static(cors::EXPOSED_HEADERS_VALUE),
        }
    }

    fn add_to(&self, response: &mut Response) {
        let headers = response.headers_mut();
        headers.append(header::VARY, self.vary.clone());
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, self.expose.clone());
    }
}

/// The app for a server bound to `local`.
pub fn app(state: AppState, local: SocketAddr) -> Edge {
    let server = &state.config.server;
    let limits = BodyLimits::new(server.max_body_bytes, server.body_read_timeout);
    let origins = Arc::new(Origins::new(&server.cors_allowed_origins, local));
    let max_header_bytes = server.max_header_bytes;
    // Embedded so the binary serves them from any working directory; `no-cache` so a rebuilt
    // binary's pages are picked up without a stale copy.
    let page = |html: &'static str| {
        axum::routing::get(move || async move {
            (
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                html,
            )
        })
    };
    let pages = Router::new()
        .route(PAGES[0], page(include_str!("../../static/index.html")))
        .route(PAGES[1], page(include_str!("../../static/dashboard.html")));
    let routes = transport::routes()
        .merge(transport::ops::routes())
        // The reader already bounds the body; this keeps axum's extractors agreeing.
        .layer(DefaultBodyLimit::max(limits.max_bytes))
        .with_state(state);
    Edge {
        pages,
        api: cors::cors(BodyReader::new(routes, limits.clone()), &origins),
        origins,
        max_bytes: limits.max_bytes,
        max_header_bytes,
        no_origin: NoOriginHeaders::new(),
    }
}

impl Edge {
    /// Answers `request` (see the module doc for what it passes).
    pub fn call(&mut self, mut request: Request) -> EdgeFuture {
        let path = request.uri().path();
        let refused = if head_limit::over_limit(request.headers(), self.max_header_bytes) {
            Some(EdgeRefusal::HeadersTooLarge {
                limit: self.max_header_bytes,
            })
        } else {
            host::refused_host_count(request.version(), request.headers()).map(|count| EdgeRefusal::BadHost { count })
        };
        if let Some(refusal) = refused {
            let dialect = dialect_of(path);
            return EdgeFuture::Refused {
                response: Some(render(refusal, dialect, &request_id(request.headers(), dialect))),
            };
        }
        let refusals = Some(Refusals {
            dialect: dialect_of(path),
            client_id: client_request_id(request.headers()).map(str::to_string),
            max_bytes: self.max_bytes,
        });
        if PAGES.contains(&path) {
            return EdgeFuture::Page {
                future: self.pages.call(request),
                refusals,
            };
        }
        if let Some(refused) = cors::guard(&self.origins, request.headers(), request.uri()) {
            return EdgeFuture::Refused {
                response: Some(refused),
            };
        }
        request.extensions_mut().insert(Arc::clone(&self.origins));
        if request.method() != Method::OPTIONS && !request.headers().contains_key(header::ORIGIN) {
            return EdgeFuture::NoOrigin {
                future: self.api.get_mut().call(request),
                headers: self.no_origin.clone(),
                refusals,
            };
        }
        EdgeFuture::Api {
            future: self.api.call(request),
            refusals,
        }
    }
}

impl Service<Request> for Edge {
    type Response = Response;
    type Error = Infallible;
    type Future = EdgeFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Routers and the body reader are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> EdgeFuture {
        Edge::call(self, request)
    }
}

pin_project! {
    /// The answer to one request through `Edge`.
    #[project = EdgeProj]
    pub enum EdgeFuture {
        Api {
            #[pin]
            future: CorsFuture<<BodyReader as Service<Request>>::Future>,
            refusals: Option<Refusals>,
        },
        /// An API request without `Origin`, past CORS (see the module doc).
        NoOrigin {
            #[pin]
            future: <BodyReader as Service<Request>>::Future,
            headers: NoOriginHeaders,
            refusals: Option<Refusals>,
        },
        Page {
            #[pin]
            future: RouteFuture<Infallible>,
            refusals: Option<Refusals>,
        },
        /// Refused by the origin guard.
        Refused { response: Option<Response> },
    }
}

impl Future for EdgeFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (answer, refusals) = match self.project() {
            EdgeProj::Api { future, refusals } => (ready!(future.poll(cx)), refusals),
            EdgeProj::NoOrigin {
                future,
                headers,
                refusals,
            } => {
                let answer = ready!(future.poll(cx)).map(|mut response| {
                    headers.add_to(&mut response);
                    response
                });
                (answer, refusals)
            }
            EdgeProj::Page { future, refusals } => (ready!(future.poll(cx)), refusals),
            EdgeProj::Refused { response } => {
                return Poll::Ready(Ok(response.take().unwrap_or_else(gone)));
            }
        };
        let Ok(response) = answer;
        Poll::Ready(Ok(match refusals.take() {
            Some(refusals) => refusals.into_json(response),
            None => gone(),
        }))
    }
}

/// A future polled again after it answered (a caller's bug): an empty 500, never a panic.
fn gone() -> Response {
    let mut response = Response::default();
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

/// What an answer needs to become one of the edge's JSON refusals.
pub struct Refusals {
    dialect: Dialect,
    /// The client's `x-request-id`; a fresh one is made only for a refusal.
    client_id: Option<String>,
    max_bytes: usize,
}

impl Refusals {
    /// axum answers an unknown path (404), a wrong method (405) and an over-limit body (413)
    /// with an empty or plain-text body; clients of every dialect parse JSON errors, so those
    /// become JSON in the path's dialect, with `x-request-id`. Answers a handler wrote as JSON
    /// (e.g. a drill on an unknown route) keep their body. Every refusal (4xx, 5xx) a handler
    /// wrote without `x-request-id` gets one, so any error a client reports can be found in
    /// the logs.
    fn into_json(self, mut response: Response) -> Response {
        let refusal = match response.status() {
            StatusCode::NOT_FOUND => EdgeRefusal::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => EdgeRefusal::MethodNotAllowed,
            StatusCode::PAYLOAD_TOO_LARGE => EdgeRefusal::TooLarge { limit: self.max_bytes },
            status if status.is_client_error() || status.is_server_error() => {
                self.mark(&mut response);
                return response;
            }
            _ => return response,
        };
        let is_json = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if is_json {
            self.mark(&mut response);
            return response;
        }
        let dialect = self.dialect;
        let id = self.id();
        let mut json = render(refusal, dialect, &id);
        // Keep what the original said besides its body: `allow` on a 405, CORS headers.
        for (name, value) in response.headers() {
            if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH && !json.headers().contains_key(name) {
                json.headers_mut().insert(name.clone(), value.clone());
            }
        }
        json
    }

    /// The client's request id, or a fresh one.
    fn id(self) -> String {
        self.client_id
            .unwrap_or_else(|| RequestCtx::new(self.dialect).request_id)
    }

    /// Gives `response` an `x-request-id` if its handler wrote none.
    fn mark(self, response: &mut Response) {
        if response.headers().contains_key(X_REQUEST_ID) {
            return;
        }
        if let Ok(id) = HeaderValue::from_str(&self.id()) {
            response.headers_mut().insert(X_REQUEST_ID, id);
        }
    }
}

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
