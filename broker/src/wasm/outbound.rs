//! Outgoing HTTP for routers granted an upstream (`wasi:http`).
//!
//! A router whose [`super::Grants::http`] names an upstream gets
//! `wasi:http/outgoing-handler` linked; every request it sends passes
//! through [`OutboundHooks::send_request`], which
//! - refuses any request whose scheme and authority are not the granted
//!   upstream's (`HTTP-request-denied` to the guest, a warning in the log,
//!   and `mcp_broker_upstream_denied_total` in the metrics);
//! - replaces whatever the guest set for each configured
//!   `upstream_headers` name with the operator's value: a router's
//!   credentials are added by the host, on the way out, for that router only;
//! - sends the requests through one pooled keep-alive client per router,
//!   shared by all its instances on all shards (connections to the
//!   upstream are reused); `https://` with rustls, trusting the webpki
//!   roots plus the router's `upstream_ca_file`;
//! - remembers the MCP requests a call has in flight upstream (the guest
//!   names each with the [`REQUEST_ID_HEADER`], which is stripped before
//!   sending). When a call ends without finishing (the client cancelled, the
//!   deadline passed, the broker drained), its store is dropped with those
//!   requests still pending, and the host sends the upstream
//!   `notifications/cancelled` for each, in the same MCP session.
//!
//! # Invariants
//! - A store without a grant refuses every request (routers without a grant
//!   never get `wasi:http` linked at all; this is the second lock).
//! - Nothing here runs guest code: the futures run on the WASM host's tokio
//!   runtime and wake the shard's task across threads.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// Idle keep-alive connections kept per upstream router: enough for every
/// instance of a few shards to find a warm connection.
const MAX_IDLE_PER_UPSTREAM: usize = 64;
/// How long an idle connection to the upstream is kept: less than the
/// idle keep-alive of common servers (uvicorn's, Node's and Apache's 5 s).
/// A request written onto a connection as the server closes it fails
/// with a reset that nothing can retry safely (the server may have read
/// it); kept 60 s, an idle upstream served by uvicorn saw such resets on
/// its refreshes, which marked it unavailable. Reconnecting after 4 s of
/// silence costs a handshake where one was due anyway.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Connect timeout when the guest sets none (the call deadline bounds the
/// whole exchange anyway).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on sending one `notifications/cancelled` upstream.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

/// The request header by which a guest names the JSON-RPC id of the MCP
/// request it sends (its value is the id's JSON text), so that the host can
/// cancel it upstream if the call is abandoned. Never sent upstream.
pub const REQUEST_ID_HEADER: &str = "mcp-broker-request-id";

/// What a router may reach: one origin, with its own headers.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpGrant {
    /// The upstream's URL (`http://host:port/path`); only its scheme and
    /// authority are enforced.
    pub url: String,
    /// Headers set on every outgoing request (the router's credentials),
    /// replacing any the guest set.
    pub headers: Vec<(String, String)>,
    /// PEM certificates trusted for `https://` besides the webpki roots
    /// (an operator's private CA).
    pub ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for HttpGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header names only: the values are the router's credentials, and a
        // spec is printed in debug logs and panics.
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("HttpGrant")
            .field("url", &self.url)
            .field("headers", &names)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// A router's outbound counters. Apart from its `Outbound` (which holds
/// the connection pool): a reload that takes the router out keeps these to
/// go on counting under its name (`upstream::Retired`), and a call the old
/// router finishes after the reload still lands in them.
#[derive(Debug, Default)]
pub struct OutboundCounters {
    /// Requests refused because they named another origin.
    pub denied: AtomicU64,
    /// `notifications/cancelled` sent upstream for abandoned requests.
    pub cancels: AtomicU64,
}

/// A checked grant with its connection pool; one per router, shared by
/// every store of that router.
pub(crate) struct Outbound {
    router: String,
    scheme: hyper::http::uri::Scheme,
    /// Lower-cased `host:port`, the port explicit.
    authority: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    client: Client<HttpsConnector<HttpConnector>, WasiBody>,
    counters: Arc<OutboundCounters>,
    /// Where abandoned requests' cancellations are sent from.
    tokio: tokio::runtime::Handle,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the headers: they hold the router's credentials.
        f.debug_struct("Outbound")
            .field("router", &self.router)
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl Outbound {
    /// Checks `grant` (an absolute `http`/`https` URL, valid header names
    /// and values). Must be called inside the host's tokio runtime context
    /// only for sending, not for building.
    pub(crate) fn new(
        router: &str,
        grant: &HttpGrant,
        tokio: tokio::runtime::Handle,
    ) -> Result<Self, String> {
        let uri: Uri = grant
            .url
            .parse()
            .map_err(|e| format!("upstream `{}` is not a URL: {e}", grant.url))?;
        let scheme = uri
            .scheme()
            .filter(|s| {
                **s == hyper::http::uri::Scheme::HTTP || **s == hyper::http::uri::Scheme::HTTPS
            })
            .cloned()
            .ok_or_else(|| {
                format!(
                    "upstream `{}` must be an http:// or https:// URL",
                    grant.url
                )
            })?;
        let authority = effective_authority(&scheme, &uri)
            .ok_or_else(|| format!("upstream `{}` has no host", grant.url))?;
        let mut headers = Vec::with_capacity(grant.headers.len());
        for (name, value) in &grant.headers {
            let n = HeaderName::try_from(name.as_str())
                .map_err(|_| format!("upstream_headers: `{name}` is not a valid header name"))?;
            let mut v = HeaderValue::try_from(value.as_str())
                // The value may be a secret: never echo it.
                .map_err(|_| {
                    format!("upstream_headers: the value of `{name}` is not a valid header value")
                })?;
            v.set_sensitive(true);
            headers.push((n, v));
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        // The TLS layer below takes https:// itself.
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(
                crate::tls::client_config(grant.ca_file.as_deref())
                    .map_err(|e| format!("upstream_ca_file {e}"))?,
            )
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(MAX_IDLE_PER_UPSTREAM)
            .build(connector);
        Ok(Self {
            router: router.to_owned(),
            scheme,
            authority,
            headers,
            client,
            counters: Arc::default(),
            tokio,
        })
    }

    /// Requests refused because they named another origin.
    pub(crate) fn denied(&self) -> u64 {
        self.counters.denied.load(Ordering::Relaxed)
    }

    /// `notifications/cancelled` sent upstream for abandoned requests.
    pub(crate) fn cancels(&self) -> u64 {
        self.counters.cancels.load(Ordering::Relaxed)
    }

    /// Its counters, to be kept past a reload that drops it.
    pub(crate) fn counters(&self) -> &Arc<OutboundCounters> {
        &self.counters
    }

    /// The upstream `notifications/cancelled` for `p`, or `None` when it
    /// cannot be built.
    fn cancel_request(&self, p: Pending) -> Option<Request<WasiBody>> {
        let body = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{},"reason":"cancelled through mcp-broker"}}}}"#,
            p.id
        );
        let mut req = Request::post(p.uri);
        if let Some(h) = req.headers_mut() {
            h.insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            h.insert(
                hyper::header::ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
            for (name, value) in p.headers {
                h.insert(name, value);
            }
            for (name, value) in &self.headers {
                h.insert(name.clone(), value.clone());
            }
        }
        let body = http_body_util::Full::new(bytes::Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync();
        req.body(body).ok()
    }

    /// The `DELETE` that ends upstream session `id` (MCP's session end).
    fn end_request(&self, uri: Uri, id: HeaderValue) -> Option<Request<WasiBody>> {
        let mut req = Request::delete(uri);
        if let Some(h) = req.headers_mut() {
            h.insert(HeaderName::from_static("mcp-session-id"), id);
            for (name, value) in &self.headers {
                h.insert(name.clone(), value.clone());
            }
        }
        let body = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        req.body(body).ok()
    }

    /// What a dropped instance leaves upstream, in the background and best
    /// effort (the upstream may be gone): `cancels` first, then `end` (a
    /// server that does not allow DELETE answers 405). In that order, one
    /// after the other: sent side by side, the DELETE often arrived first,
    /// the server forgot the session and answered the cancellation 404,
    /// and the abandoned call ran to its end upstream (rmcp does not stop
    /// a session's handlers when the session is deleted).
    fn abandon(self: &Arc<Self>, cancels: Vec<Request<WasiBody>>, end: Option<Request<WasiBody>>) {
        if cancels.is_empty() && end.is_none() {
            return;
        }
        self.counters
            .cancels
            .fetch_add(cancels.len() as u64, Ordering::Relaxed);
        let out = self.clone();
        drop(self.tokio.spawn(async move {
            for req in cancels {
                let sent = out.client.request(req);
                match tokio::time::timeout(CANCEL_TIMEOUT, sent).await {
                    Ok(Ok(res)) => tracing::debug!(router = %out.router, status = %res.status(), "upstream request cancelled"),
                    Ok(Err(e)) => tracing::debug!(router = %out.router, error = %e, "sending notifications/cancelled upstream failed"),
                    Err(_) => tracing::debug!(router = %out.router, "sending notifications/cancelled upstream timed out"),
                }
            }
            if let Some(req) = end {
                let sent = out.client.request(req);
                match tokio::time::timeout(CANCEL_TIMEOUT, sent).await {
                    Ok(Ok(res)) => tracing::debug!(router = %out.router, status = %res.status(), "upstream session ended"),
                    Ok(Err(e)) => tracing::debug!(router = %out.router, error = %e, "ending the upstream session failed"),
                    Err(_) => tracing::debug!(router = %out.router, "ending the upstream session timed out"),
                }
            }
        }));
    }

    /// Whether `uri` is the granted origin.
    fn admits(&self, uri: &Uri) -> bool {
        uri.scheme() == Some(&self.scheme)
            && effective_authority(&self.scheme, uri).as_deref() == Some(self.authority.as_str())
    }
}

/// `host:port` in lower case with the scheme's default port made explicit,
/// so that `http://H/` and `http://h:80/` compare equal.
fn effective_authority(scheme: &hyper::http::uri::Scheme, uri: &Uri) -> Option<String> {
    let host = uri.host().filter(|h| !h.is_empty())?.to_ascii_lowercase();
    let port = uri
        .port_u16()
        .unwrap_or(if *scheme == hyper::http::uri::Scheme::HTTPS {
            443
        } else {
            80
        });
    Some(format!("{host}:{port}"))
}

/// An MCP request a call has in flight upstream: what cancelling it takes.
#[derive(Debug)]
struct Pending {
    /// The JSON-RPC id, as JSON text.
    id: String,
    uri: Uri,
    /// The request's `Mcp-Session-Id` and `MCP-Protocol-Version`.
    headers: Vec<(HeaderName, HeaderValue)>,
}

/// The per-store `wasi:http` hooks: the router's [`Outbound`], or none
/// (refuse everything).
#[derive(Debug, Default)]
pub(crate) struct OutboundHooks {
    outbound: Option<Arc<Outbound>>,
    /// Requests of the current call, cancelled upstream if the store is
    /// dropped before the call finishes.
    pending: Vec<Pending>,
    /// The upstream session the guest last sent a request in (its URI
    /// and `Mcp-Session-Id`), ended with `DELETE` when the store is
    /// dropped: the guest held it in its memory, which goes with the
    /// store, and the WIT gives it no teardown to end it itself. Left
    /// open, every reload, replaced instance or evicted session left one
    /// more on the upstream until the server timed it out.
    session: Option<(Uri, HeaderValue)>,
}

/// Most requests remembered per call: a guest sends a few per call; past
/// this the oldest is forgotten rather than memory grown.
const MAX_PENDING: usize = 16;

impl OutboundHooks {
    pub(crate) fn new(outbound: Option<Arc<Outbound>>) -> Self {
        Self {
            outbound,
            pending: Vec::new(),
            session: None,
        }
    }

    /// The call finished (whatever its answer): nothing to cancel.
    pub(crate) fn settled(&mut self) {
        self.pending.clear();
    }
}

impl Drop for OutboundHooks {
    fn drop(&mut self) {
        if let Some(out) = &self.outbound {
            let cancels = self
                .pending
                .drain(..)
                .filter_map(|p| out.cancel_request(p))
                .collect();
            let end = self
                .session
                .take()
                .and_then(|(uri, id)| out.end_request(uri, id));
            out.abandon(cancels, end);
        }
    }
}

type SendResult = Result<
    (
        Response<WasiBody>,
        Box<dyn Future<Output = Result<(), Error>> + Send>,
    ),
    Error,
>;

fn ready(r: SendResult) -> Box<dyn Future<Output = SendResult> + Send> {
    Box::new(std::future::ready(r))
}

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        mut request: Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        drop(fut);
        let Some(out) = self.outbound.clone() else {
            return ready(Err(Error::HttpRequestDenied));
        };
        if !out.admits(request.uri()) {
            out.counters.denied.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                router = %out.router,
                // Scheme and authority only: a path or query may carry data.
                refused = %format_args!(
                    "{}://{}",
                    request.uri().scheme_str().unwrap_or("?"),
                    request.uri().authority().map_or("", |a| a.as_str())
                ),
                allowed = %format_args!("{}://{}", out.scheme, out.authority),
                "outgoing request to another origin refused"
            );
            return ready(Err(Error::HttpRequestDenied));
        }
        let uri = request.uri().clone();
        let headers = request.headers_mut();
        if let Some(id) = headers.get("mcp-session-id")
            && self.session.as_ref().is_none_or(|(_, s)| s != id)
        {
            self.session = Some((uri.clone(), id.clone()));
        }
        if let Some(id) = headers.remove(REQUEST_ID_HEADER)
            && let Ok(id) = id.to_str()
            && serde_json::from_str::<serde::de::IgnoredAny>(id).is_ok()
        {
            let keep = ["mcp-session-id", "mcp-protocol-version"];
            let pending = Pending {
                id: id.to_owned(),
                uri,
                headers: keep
                    .iter()
                    .filter_map(|k| Some((HeaderName::from_static(k), headers.get(*k)?.clone())))
                    .collect(),
            };
            if self.pending.len() >= MAX_PENDING {
                self.pending.remove(0);
            }
            self.pending.push(pending);
        }
        for (name, value) in &out.headers {
            headers.insert(name.clone(), value.clone());
        }
        let first_byte = options.and_then(|o| o.first_byte_timeout);
        Box::new(async move {
            let sent = out.client.request(request);
            let res = match first_byte {
                Some(t) => tokio::time::timeout(t, sent)
                    .await
                    .map_err(|_| Error::ConnectionReadTimeout)?,
                None => sent.await,
            }
            .map_err(client_error)?;
            let res = res.map(|b| b.map_err(Error::Hyper).boxed_unsync());
            let done: Box<dyn Future<Output = Result<(), Error>> + Send> =
                Box::new(std::future::ready(Ok(())));
            Ok((res, done))
        })
    }
}

/// A pooled client's failure as `wasi:http` error code the guest can name.
fn client_error(e: hyper_util::client::legacy::Error) -> Error {
    use std::error::Error as _;
    if e.is_connect() {
        let mut source = e.source();
        while let Some(s) = source {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                return match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
                    std::io::ErrorKind::TimedOut => Error::ConnectionTimeout,
                    _ => Error::InternalError(Some(format!("connect: {io}"))),
                };
            }
            source = s.source();
        }
        // hyper-util reports its own connect timeout without an io error.
        return Error::ConnectionTimeout;
    }
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    Error::InternalError(Some(msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(url: &str) -> HttpGrant {
        HttpGrant {
            url: url.into(),
            headers: vec![("Authorization".into(), "Bearer s3cret".into())],
            ca_file: None,
        }
    }

    #[test]
    fn admits_only_the_granted_origin() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let h = || rt.handle().clone();
        let o = Outbound::new("u", &grant("http://Example.com/mcp"), h()).unwrap();
        let ok = |u: &str| o.admits(&u.parse().unwrap());
        assert!(ok("http://example.com/mcp"));
        assert!(ok("http://example.com:80/other"));
        assert!(
            !ok("https://example.com/mcp"),
            "scheme is part of the origin"
        );
        assert!(!ok("http://example.com:8080/mcp"));
        assert!(!ok("http://example.com.evil/mcp"));
        assert!(!ok("http://127.0.0.1/mcp"));
        let o = Outbound::new("u", &grant("https://h:8443/x"), h()).unwrap();
        assert!(o.admits(&"https://h:8443/y".parse().unwrap()));
        assert!(!o.admits(&"https://h/y".parse().unwrap()));
    }

    #[test]
    fn bad_grants_are_refused_without_echoing_secrets() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let h = || rt.handle().clone();
        assert!(Outbound::new("u", &grant("ftp://h/x"), h()).is_err());
        assert!(Outbound::new("u", &grant("/relative"), h()).is_err());
        let e = Outbound::new(
            "u",
            &HttpGrant {
                url: "http://h/".into(),
                headers: vec![("X-Key".into(), "line\nbreak-secret".into())],
                ca_file: None,
            },
            h(),
        )
        .unwrap_err();
        assert!(e.contains("X-Key") && !e.contains("secret"), "{e}");
        let o = Outbound::new("u", &grant("http://h/"), h()).unwrap();
        assert!(!format!("{o:?}").contains("s3cret"));
        let g = format!("{:?}", grant("http://h/"));
        assert!(g.contains("Authorization") && !g.contains("s3cret"), "{g}");
    }
}
