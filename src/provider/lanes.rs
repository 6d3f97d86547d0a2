//! Lanes: the upstream client's pools per upstream, so that a stream beyond one HTTP/2
//! connection's limit opens another connection instead of waiting for a slot on a full one.
//!
//! Why: hyper-util's pooled client multiplexes every request to an HTTP/2 host over one
//! connection and never opens a second when the peer's SETTINGS_MAX_CONCURRENT_STREAMS is
//! reached; the request waits inside hyper until some stream ends. LLM streams last tens of
//! seconds, so the (limit + 1)-th stream to a provider would wait with no first token, be
//! hedged, and blame a healthy route.
//!
//! How: per upstream (scheme, authority, prior knowledge, connect timeout) a small set of pooled clients, the
//! lanes, each with its own pool over the same connector and a count of its requests in
//! flight. A request takes the first lane with room under the peer's stream limit (read from
//! the connection's preface, `settings`; until then, and when the peer names none,
//! `DEFAULT_STREAMS_PER_CONNECTION`), and a new lane is made when every lane is full, up to
//! `MAX_LANES`; beyond that the least loaded lane takes it and hyper queues it, as before
//! (logged once per upstream). The count is released when the response's body ends or is
//! dropped, when the request fails, and when its future is dropped (a hedge's loser).
//!
//! Below the limit, streams share one connection. An HTTP/1.1 upstream (known from its first
//! answer) uses one lane: its pool already opens a connection per request in flight.
//!
//! A new lane assumes the smallest limit its siblings have read from the peer. Known limit:
//! until the first lane's connection has read the peer's preface, that lane takes up to the
//! default; a peer that allows fewer sees those first streams queue in hyper until some end.
//! Only the preface's limit is read, not a later change.
//!
//! Bounded: lanes per upstream by `MAX_LANES`, upstreams by `MAX_UPSTREAMS` (they come from
//! the route config, never from a request; past the bound they share one overflow set).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::Either;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::{Client, ResponseFuture};
use parking_lot::Mutex;

use super::client::{pooled, Connector, RequestBody};
use super::h1_pool::{H1Body, H1Pool};
use super::h2_body::H2Body;
use super::h2_pool::{H2Pool, Sending};
use super::settings::{ReadsStreamLimit, DEFAULT_STREAMS_PER_CONNECTION};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Lanes (pools, so HTTP/2 connections) per upstream at most: at the default limit, 3,200
/// streams at once to one upstream before any waits in hyper.
pub const MAX_LANES: usize = 32;

/// The name of the set the upstreams past `MAX_UPSTREAMS` share (no one target: never on
/// `h2_pool`).
const OVERFLOW: &str = "(overflow)";

/// Upstreams with lanes of their own at most (one per distinct route base URL).
pub(crate) const MAX_UPSTREAMS: usize = 1024;

type LaneClient = Client<ReadsStreamLimit<Connector>, RequestBody>;

/// Every upstream's lanes, for one `HttpClient` and its clones.
pub(crate) struct Lanes {
    connector: Connector,
    /// What a lane takes before its peer's settings say otherwise (tests lower it).
    default_limit: usize,
    upstreams: Mutex<HashMap<Upstream, Arc<LaneSet>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Upstream {
    scheme: Option<Scheme>,
    authority: Option<Authority>,
    prior_knowledge: bool,
    /// The bound on each connect of its lanes (routes to one host may set different ones).
    connect_timeout: Duration,
    /// Reached through the egress proxy (decided by the URI alone today; part of the key so
    /// a direct set can never carry a proxied request in origin form).
    proxied: bool,
}

impl Lanes {
    pub fn new(connector: Connector) -> Self {
        Lanes::with_default_limit(connector, DEFAULT_STREAMS_PER_CONNECTION)
    }

    pub fn with_default_limit(connector: Connector, default_limit: usize) -> Self {
        Lanes {
            connector,
            default_limit,
            upstreams: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `request` on a lane with room, a new connection's connect bounded by
    /// `connect_timeout`; resolves at the response's head. An upstream known to speak HTTP/2
    /// (prior knowledge with no proxy in between, or an https one whose answer came over h2)
    /// is sent to on its own connections (`h2_pool`), anything else on a pooled lane.
    pub fn send(
        &self,
        request: Request<RequestBody>,
        prior_knowledge: bool,
        connect_timeout: Duration,
        proxied: bool,
    ) -> impl Future<Output = Result<Response<LaneBody>, BoxError>> + Send + 'static {
        let set = self.set_for(request.uri(), prior_knowledge, connect_timeout, proxied);
        if let Some(h1) = &set.h1 {
            let sending = Arc::clone(h1).send(request);
            return Either::Left(Either::Right(async move { Ok(sending.await?.map(LaneBody::h1)) }));
        }
        if !set.speaks_h2.load(Ordering::Relaxed) {
            return Either::Left(Either::Left(set.pooled(request)));
        }
        let sending = Arc::clone(&set.h2).send(request);
        Either::Right(async move {
            match sending.await {
                Ok(response) => Ok(response.map(LaneBody::h2)),
                Err(Sending::Failed(e)) => Err(e),
                Err(Sending::NotH2(request)) => {
                    set.speaks_h2.store(false, Ordering::Relaxed);
                    set.pooled(*request).await
                }
            }
        })
    }

    fn set_for(&self, uri: &Uri, prior_knowledge: bool, connect_timeout: Duration, proxied: bool) -> Arc<LaneSet> {
        let mut key = Upstream {
            scheme: uri.scheme().cloned(),
            authority: uri.authority().cloned(),
            prior_knowledge,
            connect_timeout,
            proxied,
        };
        let mut upstreams = self.upstreams.lock();
        if !upstreams.contains_key(&key) && upstreams.len() >= MAX_UPSTREAMS {
            key = Upstream {
                scheme: None,
                authority: None,
                prior_knowledge,
                connect_timeout,
                proxied,
            };
        }
        let set = upstreams.entry(key).or_insert_with_key(|key| {
            let upstream = key
                .authority
                .as_ref()
                .map_or_else(|| OVERFLOW.into(), ToString::to_string);
            let connector = self.connector.with_timeout(key.connect_timeout);
            let target = target(key);
            // A plain-http upstream reached directly without prior knowledge speaks HTTP/1.1
            // from its first byte: on connections of our own.
            let h1 = target
                .clone()
                .filter(|t| !prior_knowledge && !proxied && t.scheme() == Some(&Scheme::HTTP))
                .and_then(|t| H1Pool::new(upstream.clone(), t, connector.clone()))
                .map(Arc::new);
            Arc::new(LaneSet {
                h1,
                // A plain-http request through a proxy goes to the proxy in absolute form,
                // which only the pooled client speaks; the overflow set has no one target.
                speaks_h2: AtomicBool::new(prior_knowledge && !proxied && target.is_some()),
                h2: Arc::new(H2Pool::new(
                    upstream.clone(),
                    target.unwrap_or_default(),
                    prior_knowledge,
                    connector.clone(),
                )),
                upstream,
                prior_knowledge,
                connector,
                default_limit: self.default_limit,
                http1: AtomicBool::new(false),
                full_logged: AtomicBool::new(false),
                lanes: Mutex::new(Vec::new()),
            })
        });
        Arc::clone(set)
    }

    /// The own HTTP/1.1 connections of the upstream of `uri`: idle ones, and answers holding
    /// theirs; `None` when it is not sent to on them.
    #[cfg(test)]
    pub fn h1(&self, uri: &Uri) -> Option<(usize, usize)> {
        let set = self.set_for(uri, false, super::client::CONNECT_TIMEOUT, false);
        set.h1.as_ref().map(|h1| h1.counts())
    }

    /// Connections (HTTP/2, own) or lanes (pooled) made for the upstream of `uri` so far,
    /// and requests in flight on them.
    #[cfg(test)]
    pub fn to(&self, uri: &Uri, prior_knowledge: bool) -> (usize, usize) {
        let set = self.set_for(uri, prior_knowledge, super::client::CONNECT_TIMEOUT, false);
        if let Some(h1) = &set.h1 {
            return (1, h1.counts().1);
        }
        if set.speaks_h2.load(Ordering::Relaxed) {
            return set.h2.counts();
        }
        let lanes = set.lanes.lock();
        let in_flight = lanes.iter().map(|l| l.in_flight.load(Ordering::Relaxed)).sum();
        (lanes.len(), in_flight)
    }
}

/// `scheme://authority/` of an upstream, what a connector reaches.
fn target(key: &Upstream) -> Option<Uri> {
    let (scheme, authority) = (key.scheme.clone()?, key.authority.clone()?);
    Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query("/")
        .build()
        .ok()
}

/// One upstream's lanes.
struct LaneSet {
    /// Host and port, for the log line when every lane is full.
    upstream: String,
    /// Sent to on `h1` whenever there is one: plain http, reached directly, no prior knowledge.
    h1: Option<Arc<H1Pool>>,
    /// Sent to on `h2`: known to speak HTTP/2 (and reached directly or through a tunnel).
    speaks_h2: AtomicBool,
    h2: Arc<H2Pool>,
    prior_knowledge: bool,
    connector: Connector,
    default_limit: usize,
    /// The upstream answered over HTTP/1.1: one lane is enough.
    http1: AtomicBool,
    full_logged: AtomicBool,
    lanes: Mutex<Vec<Arc<Lane>>>,
}

impl LaneSet {
    /// Sends `request` on a pooled lane.
    fn pooled(self: &Arc<Self>, request: Request<RequestBody>) -> Sent {
        let in_flight = self.take();
        Sent {
            inner: in_flight.0.client.request(request),
            in_flight: Some(in_flight),
            set: Arc::clone(self),
        }
    }

    /// A lane for one more request, counted in it.
    fn take(&self) -> InFlight {
        let mut lanes = self.lanes.lock();
        let pick = if self.http1.load(Ordering::Relaxed) {
            lanes.first().cloned()
        } else {
            lanes.iter().find(|lane| lane.has_room()).cloned()
        };
        let lane = match pick {
            Some(lane) => lane,
            None if lanes.len() < MAX_LANES => {
                let lane = Arc::new(self.lane(&lanes));
                lanes.push(Arc::clone(&lane));
                lane
            }
            None => {
                if !self.full_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        upstream = %self.upstream,
                        lanes = MAX_LANES,
                        "every connection to the upstream is at its stream limit; further requests wait for a stream to end"
                    );
                }
                match lanes.iter().min_by_key(|lane| lane.in_flight.load(Ordering::Relaxed)) {
                    Some(lane) => Arc::clone(lane),
                    None => {
                        let lane = Arc::new(self.lane(&lanes));
                        lanes.push(Arc::clone(&lane));
                        lane
                    }
                }
            }
        };
        lane.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(lane)
    }

    /// A new lane, taking the smallest limit its siblings have read from the same peer
    /// (the default when it has none): a peer that allows one stream per connection would
    /// otherwise see a burst queue on the new lane's one connection until its preface came.
    fn lane(&self, siblings: &[Arc<Lane>]) -> Lane {
        let assumed = siblings
            .iter()
            .map(|lane| lane.limit.load(Ordering::Relaxed))
            .min()
            .unwrap_or(self.default_limit)
            .max(1);
        let limit = Arc::new(AtomicUsize::new(assumed));
        let connector = ReadsStreamLimit {
            inner: self.connector.clone(),
            limit: Arc::clone(&limit),
            prior_knowledge: self.prior_knowledge,
        };
        Lane {
            client: pooled(connector, self.prior_knowledge),
            in_flight: AtomicUsize::new(0),
            limit,
        }
    }
}

/// One pool to an upstream and the requests in flight on it.
struct Lane {
    client: LaneClient,
    in_flight: AtomicUsize,
    /// The peer's stream limit on the lane's latest HTTP/2 connection.
    limit: Arc<AtomicUsize>,
}

impl Lane {
    fn has_room(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) < self.limit.load(Ordering::Relaxed)
    }
}

/// A request counted in its lane until this is dropped.
pub(crate) struct InFlight(Arc<Lane>);

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InFlight")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request on its lane, until the response's head.
pub struct Sent {
    inner: ResponseFuture,
    in_flight: Option<InFlight>,
    set: Arc<LaneSet>,
}

impl Future for Sent {
    type Output = Result<Response<LaneBody>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answered = ready!(Pin::new(&mut self.inner).poll(cx));
        let in_flight = self.in_flight.take();
        Poll::Ready(match answered {
            Ok(response) => {
                if response.version() < http::Version::HTTP_2 {
                    self.set.http1.store(true, Ordering::Relaxed);
                } else if !self.set.prior_knowledge && self.set.upstream != OVERFLOW {
                    // An https upstream that negotiated h2: its next requests go on its own
                    // connections (this lane's connection idles out of the pool).
                    self.set.speaks_h2.store(true, Ordering::Relaxed);
                }
                Ok(response.map(|body| LaneBody {
                    body: Inner::Pooled(body),
                    in_flight,
                }))
            }
            Err(e) => Err(Box::new(e)),
        })
    }
}

/// An upstream response's body, holding its request's place on its lane (or connection)
/// until it ends or is dropped.
#[derive(Debug)]
pub struct LaneBody {
    body: Inner,
    in_flight: Option<InFlight>,
}

#[derive(Debug)]
enum Inner {
    Pooled(Incoming),
    /// Its connection goes back to its pool when it ends.
    H1(H1Body),
    /// Its place on the connection is the body's own.
    H2(H2Body),
}

impl LaneBody {
    fn h1(body: H1Body) -> Self {
        LaneBody {
            body: Inner::H1(body),
            in_flight: None,
        }
    }

    fn h2(body: H2Body) -> Self {
        LaneBody {
            body: Inner::H2(body),
            in_flight: None,
        }
    }
}

/// A body's failure, as hyper or h2 told it.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(transparent)]
    Pooled(#[from] hyper::Error),
    #[error(transparent)]
    H2(#[from] h2::Error),
}

impl Body for LaneBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = match &mut self.body {
            Inner::Pooled(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Inner::H1(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Inner::H2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        };
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.in_flight = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Inner::Pooled(body) => body.is_end_stream(),
            Inner::H1(body) => body.is_end_stream(),
            Inner::H2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Inner::Pooled(body) => body.size_hint(),
            Inner::H1(body) => body.size_hint(),
            Inner::H2(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests;
