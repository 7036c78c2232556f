//! A frame server that takes a bearer token in each connection's
//! `InitializeRequest` (as the broker's frame edge does with `[auth]`):
//! for `--bearer-file` on `frames://` and `frames+tls://`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mcp_schema::encode::{Correlation, ReplyTo};
use mcp_schema::fb::protocol::{
    InitializeResponse, InitializeResponseArgs, ProtocolVersion, RequestPayload, ResponsePayload,
    ServerCapabilities, ServerCapabilitiesArgs,
};
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{ErrorCode, ResponseEncoder};

/// What the server saw, over all connections.
#[derive(Debug, Default)]
pub struct Seen {
    /// The `auth_token` of every InitializeRequest, in arrival order.
    pub inits: Vec<Option<String>>,
    /// Whether every initialize was its connection's first frame.
    pub init_first: bool,
    pub calls: u64,
    /// Tool calls on a connection before its initialize was accepted.
    pub calls_before_init: u64,
}

/// A frame server that accepts an initialize carrying `accept` and refuses
/// any other with `Unauthorized`. Its answer to an initialize comes after a
/// final frame of another correlation (which the client must skip), and
/// is written in small pieces (so the client reads it across reads).
pub fn spawn(accept: &'static str) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen {
        init_first: true,
        ..Seen::default()
    }));
    let s2 = Arc::clone(&seen);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            s.set_nodelay(true).unwrap();
            let seen = Arc::clone(&s2);
            std::thread::spawn(move || serve(s, accept, &seen));
        }
    });
    (addr, seen)
}

fn serve(mut s: TcpStream, accept: &str, seen: &Mutex<Seen>) {
    let mut enc = ResponseEncoder::new(3);
    let mut frames = 0u64;
    let mut accepted = false;
    loop {
        let mut len = [0u8; 4];
        if s.read_exact(&mut len).is_err() {
            return;
        }
        let n = u32::from_le_bytes(len) as usize;
        let mut frame = vec![0u8; 4 + n];
        frame[..4].copy_from_slice(&len);
        if s.read_exact(&mut frame[4..]).is_err() {
            return;
        }
        frames += 1;
        let req = VerifiedRequest::verify(Bytes::from(frame)).expect("a valid request");
        let v = req.view();
        let to = v.reply_to();
        let r = v.request();
        let bytes = match r.payload_type() {
            RequestPayload::InitializeRequest => {
                let token = r
                    .payload_as_initialize_request()
                    .and_then(|i| i.auth_token())
                    .map(str::to_owned);
                {
                    let mut seen = seen.lock().unwrap();
                    seen.init_first &= frames == 1;
                    seen.inits.push(token.clone());
                }
                if token.as_deref() == Some(accept) {
                    accepted = true;
                    let other = ReplyTo {
                        correlation: Correlation::Text("not-the-initialize"),
                        session_id: None,
                    };
                    let mut out = enc.pong(&other).to_vec();
                    out.extend_from_slice(&initialize_response(&mut enc, &to));
                    out
                } else {
                    enc.error(
                        &to,
                        ErrorCode::Unauthorized,
                        "invalid token: this test server refuses it",
                        None,
                    )
                    .to_vec()
                }
            }
            RequestPayload::ToolCall => {
                {
                    let mut seen = seen.lock().unwrap();
                    seen.calls += 1;
                    seen.calls_before_init += u64::from(!accepted);
                }
                let id = *v.tool_call().expect("a tool call").id();
                enc.tool_text(&to, &id, "ok", None, false).to_vec()
            }
            other => panic!("unexpected request {other:?}"),
        };
        let pieces: Vec<&[u8]> = if frames == 1 {
            bytes.chunks(7).collect()
        } else {
            vec![&bytes]
        };
        for p in pieces {
            if s.write_all(p).is_err() {
                return;
            }
            if frames == 1 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

fn initialize_response(enc: &mut ResponseEncoder, to: &ReplyTo<'_>) -> Vec<u8> {
    let fbb = enc.begin();
    let name = fbb.create_string("bearer-test");
    let caps = ServerCapabilities::create(
        fbb,
        &ServerCapabilitiesArgs {
            supports_tools: true,
            protocol_version: ProtocolVersion::V2025_06_18,
            server_name: Some(name),
            ..Default::default()
        },
    );
    let p = InitializeResponse::create(
        fbb,
        &InitializeResponseArgs {
            server_capabilities: Some(caps),
            ..Default::default()
        },
    );
    enc.finish(
        to,
        ResponsePayload::InitializeResponse,
        p.as_union_value(),
        true,
    )
    .to_vec()
}
