//! The `grpc://` driver: `turbomcp.mcp.v1.McpService` over HTTP/2 with a
//! tonic client.
//!
//! Each `--connections` is its own tonic `Channel` (its own TCP connection
//! and HTTP/2 session), opened before the start line; each worker thread
//! runs its channels on one current-thread tokio runtime. A connection's
//! sender follows exactly the frame driver's rules (window, schedule,
//! quota, intended send time: `engine::Pacer`, `engine::wait_until`)
//! and starts every call as its own task, so many calls are in flight as
//! concurrent HTTP/2 streams of that channel.
//!
//! # Invariants
//! - A call is registered as outstanding before it is started, and ends
//!   exactly once: the first of its response, its timeout or the run
//!   stopping removes it from `outstanding`; a later completion is
//!   ignored, except that one after its timeout is counted as late.
//! - A unary RPC has no correlation id: tonic pairs a response with its
//!   stream. prost decodes the body as the RPC's declared message, so a
//!   response of another shape fails decoding and arrives as an `INTERNAL`
//!   status, counted as `grpc_internal` like every other non-OK status.
//! - A status with a transport cause (connection refused, reset, closed)
//!   is a lost connection, not a server answer: the run stops, like a lost
//!   frame connection.
//! - With `--bearer-file`, every call carries `authorization: Bearer
//!   <token>` metadata (the broker's gRPC edge checks it per call), added
//!   by the [`Bearer`] interceptor from one `MetadataValue` parsed per run.

use std::error::Error as _;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use mcp_proto::v1 as pb;
use mcp_schema::client::Listing;
use pb::mcp_service_client::McpServiceClient;
use tokio::task::JoinSet;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::engine::{CONNECT_TIMEOUT, ConnCtx, Driver, Pacer, Step, ThreadCtx};
use crate::notify::{Either, race, yield_now};
use crate::rt::Tokio;
use crate::stats::ErrorKind;
use crate::tls::TlsClient;
use crate::workload::Next;

#[derive(Clone, Debug)]
pub struct GrpcDriver {
    /// Largest response message accepted (`--max-frame`).
    pub max_message: usize,
    /// `grpcs://`: the run's TLS settings; tonic's own rustls client (ALPN
    /// h2) is configured from `tls.tonic`, built once per run.
    pub tls: Option<Arc<TlsClient>>,
    /// `--bearer-file`: the metadata every call carries.
    pub bearer: Bearer,
}

/// Adds `authorization: Bearer <token>` to every call when a token was
/// given; else lets calls through untouched. Cloned with each call's
/// client: the value is shared bytes, parsed once per run.
#[derive(Clone, Debug, Default)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Bearer {
    /// The metadata value for `token` (`Bearer <token>`).
    pub fn new(token: Option<&str>) -> Result<Self, String> {
        token
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {t}"))
                    .map_err(|e| format!("--bearer-file: the token is no metadata value: {e}"))
            })
            .transpose()
            .map(Bearer)
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Client = McpServiceClient<InterceptedService<Channel, Bearer>>;

/// One call, built before it is started.
enum Call {
    Tool(pb::CallToolRequest),
    Prompt(pb::GetPromptRequest),
    Resource(pb::ReadResourceRequest),
    List(Listing),
    Ping,
}

impl Call {
    fn of(next: Next<'_>) -> Self {
        match next {
            Next::Tool { name, args } => Call::Tool(pb::CallToolRequest {
                name: name.to_owned(),
                arguments: Some(args.to_vec()),
            }),
            Next::Prompt { name, args } => Call::Prompt(pb::GetPromptRequest {
                name: name.to_owned(),
                arguments: Some(args.to_vec()),
            }),
            Next::Resource { uri } => Call::Resource(pb::ReadResourceRequest {
                uri: uri.to_owned(),
            }),
            Next::List(l) => Call::List(l),
            Next::Ping => Call::Ping,
        }
    }

    /// The call's outcome: `Ok(true)` for a `CallToolResult` with
    /// `is_error` (the tool ran and failed).
    async fn run(self, c: &mut Client) -> Result<bool, tonic::Status> {
        fn answered<T>(r: Result<T, tonic::Status>) -> Result<bool, tonic::Status> {
            r.map(|_| false)
        }
        match self {
            Call::Tool(r) => c
                .call_tool(r)
                .await
                .map(|r| r.into_inner().is_error == Some(true)),
            Call::Prompt(r) => answered(c.get_prompt(r).await),
            Call::Resource(r) => answered(c.read_resource(r).await),
            Call::List(Listing::Tools) => {
                answered(c.list_tools(pb::ListToolsRequest { cursor: None }).await)
            }
            Call::List(Listing::Resources) => answered(
                c.list_resources(pb::ListResourcesRequest { cursor: None })
                    .await,
            ),
            Call::List(Listing::ResourceTemplates) => answered(
                c.list_resource_templates(pb::ListResourceTemplatesRequest { cursor: None })
                    .await,
            ),
            Call::List(Listing::Prompts) => answered(
                c.list_prompts(pb::ListPromptsRequest { cursor: None })
                    .await,
            ),
            Call::Ping => answered(c.ping(pb::PingRequest {}).await),
        }
    }
}

/// `e` and its causes, `a: b: c`: tonic's own message is only
/// "transport error".
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl Driver for GrpcDriver {
    type Rt = Tokio;
    type Conn = Client;

    async fn connect(&self, addr: SocketAddr) -> io::Result<Client> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| io::Error::other(chain(&e)))?
            .tcp_nodelay(true)
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(tls) = &self.tls {
            // The handshake is part of `connect` below: connection setup,
            // before the start line.
            ep = ep
                .tls_config(tls.tonic.clone())
                .map_err(|e| io::Error::other(chain(&e)))?;
        }
        // `connect` (not `connect_lazy`): one TCP connection and HTTP/2
        // handshake per channel, made now, before the start line.
        let ch = ep.connect().await.map_err(|e| {
            let tls = self.tls.as_ref().and_then(|t| t.explain_chain(&e));
            io::Error::other(tls.unwrap_or_else(|| chain(&e)))
        })?;
        Ok(McpServiceClient::with_interceptor(ch, self.bearer.clone())
            .max_decoding_message_size(self.max_message))
    }

    async fn drive(&self, client: Client, ctx: Rc<ThreadCtx>, cc: Rc<ConnCtx>) {
        let mut tasks = JoinSet::new();
        send_loop(&ctx, &cc, &client, &mut tasks).await;
        cc.sending_done.set(true);
        // Wait for the outstanding calls: each ends by its own task, by a
        // timeout (the engine's sweep) or by the run stopping.
        while !ctx.stop.get() && !cc.reader_stop.is_raised() && !cc.outstanding.borrow().is_empty()
        {
            match race(tasks.join_next(), cc.reader_stop.wait()).await {
                Either::Left(None) => break,
                Either::Left(Some(_)) | Either::Right(()) => {}
            }
        }
        // Calls still running (timed out, or the run stopped) are
        // cancelled: their streams are reset.
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        cc.finished.set(true);
    }
}

async fn send_loop(
    ctx: &Rc<ThreadCtx>,
    cc: &Rc<ConnCtx>,
    client: &Client,
    tasks: &mut JoinSet<()>,
) {
    let mut generator = Pacer::generator(ctx, cc);
    let mut pacer = Pacer::new(ctx, cc);
    loop {
        // Reap finished call tasks so the set stays small.
        while tasks.try_join_next().is_some() {}
        let now = Instant::now();
        let room = match pacer.step(ctx, cc, now) {
            Step::Stop => break,
            Step::WaitUntil(t) => {
                ctx.clock.wait_until::<Tokio>(t, &cc.writer_wake).await;
                continue;
            }
            Step::WindowFull => {
                cc.writer_wake.notified().await;
                continue;
            }
            Step::Send(room) => room,
        };
        for _ in 0..room {
            let Some(intended) = pacer.intended(ctx, now) else {
                break;
            };
            let (next, expect) = generator.next_json();
            let call = Call::of(next);
            let seq = pacer.sent(ctx, cc, intended, now, expect);
            let (ctx, cc, mut client) = (Rc::clone(ctx), Rc::clone(cc), client.clone());
            let clock = Rc::clone(&ctx.clock);
            tasks.spawn_local(clock.counted(async move {
                let res = call.run(&mut client).await;
                on_response(&ctx, &cc, seq, res);
            }));
        }
        // Let the calls just started reach the wire before starting more.
        yield_now().await;
    }
    pacer.finish(ctx, cc);
}

fn on_response(ctx: &ThreadCtx, cc: &ConnCtx, seq: u64, res: Result<bool, tonic::Status>) {
    let now = Instant::now();
    let (p, was_full) = {
        let mut o = cc.outstanding.borrow_mut();
        let was_full = o.len() as u64 >= cc.plan.window;
        match o.remove(&seq) {
            Some(p) => (p, was_full),
            // Already ended: by its timeout (then this answer is late), or
            // by the run stopping (then it is ignored).
            None => {
                drop(o);
                if let Some(measured) = cc.timed_out.borrow_mut().take(seq) {
                    ctx.on_late(measured);
                }
                return;
            }
        }
    };
    cc.ended(was_full, now);
    match res {
        Ok(false) => ctx.on_end(&p, now, Ok(())),
        Ok(true) => ctx.on_end(&p, now, Err((ErrorKind::ToolError, None))),
        Err(ref st) if let Some(cause) = st.source() => {
            // No answer from the server: the connection failed.
            ctx.on_end(&p, now, Err((ErrorKind::ConnectionLost, None)));
            ctx.conn_failed(
                cc,
                format!("connection to {} failed: {}", ctx.cfg.target, chain(cause)),
            );
            return;
        }
        Err(st) => ctx.on_end(
            &p,
            now,
            Err((ErrorKind::GrpcStatus, Some(st.code() as i32))),
        ),
    }
    if was_full {
        cc.writer_wake.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_interceptor_adds_the_token_to_every_call() {
        let mut b = Bearer::new(Some("abc.def-ghi")).unwrap();
        for _ in 0..2 {
            let r = b.call(tonic::Request::new(())).unwrap();
            assert_eq!(
                r.metadata().get("authorization").unwrap(),
                "Bearer abc.def-ghi"
            );
        }
        let mut none = Bearer::new(None).unwrap();
        let r = none.call(tonic::Request::new(())).unwrap();
        assert!(r.metadata().get("authorization").is_none());
        assert!(Bearer::new(Some("a\nb")).is_err());
    }
}
