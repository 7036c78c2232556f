//! Test harness: the real `mcp-broker` binary on loopback port 0, and a
//! blocking frame client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub mod grpc;
pub mod http;
pub mod jwt;
pub mod prometheus;

use mcp_schema::client::{RequestEncoder, RequestHeader, ResponseView};

/// Every listener on a free loopback port.
pub const PORT_ZERO: [&str; 8] = [
    "--listen",
    "127.0.0.1:0",
    "--grpc-listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
    "--metrics-listen",
    "127.0.0.1:0",
];

/// A loopback port that refuses connections and that no other test takes
/// meanwhile: a socket bound to it that never listens, which the kernel's
/// port-0 allocation skips (only an explicit bind of this very port with
/// `SO_REUSEADDR` could share it). A port merely found free and closed
/// again could be taken by any other test's listener (another broker's
/// HTTP edge answers MCP), so "down" is held, not hoped for.
/// A server can be handed the socket to listen on (`upstream.rs`
/// `Upstream::start_on`).
pub struct DeadPort {
    pub sock: socket2::Socket,
    pub port: u16,
}

impl DeadPort {
    /// Any free port.
    pub fn any() -> DeadPort {
        Self::on(0).expect("bind a loopback port")
    }

    /// `port`, retried for 10 s: the port of a server just killed lingers a
    /// moment.
    pub fn reclaim(port: u16) -> DeadPort {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::on(port) {
                Ok(d) => return d,
                Err(e) if Instant::now() > until => panic!("reclaim port {port}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn on(port: u16) -> std::io::Result<DeadPort> {
        use socket2::{Domain, Socket, Type};
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        // Over the killed server's TIME_WAIT connections, as uvicorn would.
        sock.set_reuse_address(true)?;
        sock.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())?;
        let port = sock.local_addr()?.as_socket().unwrap().port();
        Ok(DeadPort { sock, port })
    }
}

pub struct Broker {
    pub child: Child,
    pub frames: SocketAddr,
    pub grpc: SocketAddr,
    /// The MCP Streamable HTTP edge; its endpoint is [`Broker::mcp_url`].
    pub http: SocketAddr,
    pub metrics: SocketAddr,
    pub shards: usize,
    pub routers: Vec<String>,
    pub ready_line: String,
    _config: Option<tempfile_path::TempPath>,
}

mod tempfile_path {
    /// A file removed on drop.
    pub struct TempPath(pub std::path::PathBuf);
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn routers_built() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../routers/target/wasm32-wasip2/release"
    );
    for r in ["echo", "kv", "library", "chaos", "upstream", "netprobe"] {
        let p = std::path::Path::new(dir).join(format!("{r}.wasm"));
        assert!(
            p.exists(),
            "{} is missing: run scripts/build-routers first",
            p.display()
        );
    }
}

/// The embedded default with the `chaos` router appended: what most tests
/// run on (chaos is not served by default).
pub fn default_with_chaos() -> String {
    format!(
        "{}\n{}",
        mcp_broker::config::DEFAULT_TOML,
        include_str!("../fixtures/chaos.toml")
    )
}

/// `toml` with the `key = value` lines of `keys` set in its `[http]`
/// table (replacing the table's own lines for those keys).
pub fn with_http_keys(toml: &str, keys: &str) -> String {
    let start = toml.find("\n[http]\n").expect("an [http] table") + 1;
    let end = toml[start + 1..]
        .find("\n[")
        .map_or(toml.len(), |i| start + 1 + i + 1);
    let mut table: Vec<String> = toml[start..end]
        .lines()
        .filter(|l| {
            !keys.lines().any(|k| {
                let name = k.split('=').next().unwrap().trim();
                l.split('=').next().unwrap().trim() == name
            })
        })
        .map(String::from)
        .collect();
    table.extend(keys.lines().map(String::from));
    format!("{}{}\n{}", &toml[..start], table.join("\n"), &toml[end..])
}

impl Broker {
    /// Starts the broker on port 0 everywhere with `args` added, on the
    /// embedded default plus the `chaos` router ([`default_with_chaos`]).
    pub fn start(args: &[&str]) -> Broker {
        Self::start_inner(Some(&default_with_chaos()), args, |_| {})
    }

    /// Starts the broker on the embedded default alone (no `--config`).
    pub fn start_default(args: &[&str]) -> Broker {
        Self::start_inner(None, args, |_| {})
    }

    /// Starts the broker with a config file holding `toml`.
    pub fn start_with_config(toml: &str, args: &[&str]) -> Broker {
        Self::start_inner(Some(toml), args, |_| {})
    }

    /// [`Self::start_with_config`] with extra environment variables (e.g.
    /// the debug build's fault injection, `broker/src/fault.rs`).
    pub fn start_with_env(toml: &str, args: &[&str], env: &[(&str, &str)]) -> Broker {
        Self::start_inner(Some(toml), args, |c| {
            c.envs(env.iter().copied());
        })
    }

    /// Like [`Broker::start_with_config`] (`None`: the embedded default),
    /// with `edit` applied to the command before it is spawned (its
    /// environment, limits, stderr).
    pub fn start_command(
        toml: Option<&str>,
        args: &[&str],
        edit: impl FnOnce(&mut Command),
    ) -> Broker {
        Self::start_inner(toml, args, edit)
    }

    fn start_inner(toml: Option<&str>, args: &[&str], edit: impl FnOnce(&mut Command)) -> Broker {
        Self::start_full(toml, args, edit, true)
    }

    /// Like [`Broker::start_command`], but without the `--listen 127.0.0.1:0`
    /// flags: the listeners are the config file's, which a reload may then
    /// move (a flag would win over the file).
    pub fn start_on_file_listeners(args: &[&str]) -> Broker {
        Self::start_full(None, args, |_| {}, false)
    }

    fn start_full(
        toml: Option<&str>,
        args: &[&str],
        edit: impl FnOnce(&mut Command),
        port_zero_flags: bool,
    ) -> Broker {
        routers_built();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-broker"));
        if port_zero_flags {
            cmd.args(PORT_ZERO);
        }
        let config = toml.map(|t| {
            let path = std::env::temp_dir().join(format!(
                "mcp-broker-test-{}-{}.toml",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::write(&path, t).unwrap();
            cmd.arg("--config").arg(&path);
            tempfile_path::TempPath(path)
        });
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        edit(&mut cmd);
        let mut child = cmd.spawn().expect("spawn mcp-broker");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            // Keep draining so the broker never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!("mcp-broker printed no ready line within 120 s");
            }
        };
        let field = |k: &str| -> String {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("no {k}= in ready line {line:?}"))
                .to_string()
        };
        assert!(line.starts_with("mcp-broker ready "), "{line}");
        Broker {
            frames: field("frames").parse().unwrap(),
            grpc: field("grpc").parse().unwrap(),
            http: field("http").parse().unwrap(),
            metrics: field("metrics").parse().unwrap(),
            shards: field("shards").parse().unwrap(),
            routers: field("routers").split(',').map(String::from).collect(),
            ready_line: line,
            child,
            _config: config,
        }
    }

    /// Starts the broker like [`Broker::start_with_config`], keeping a copy
    /// of its stderr (the log) while passing it on to the test's own.
    pub fn start_logged(toml: &str, args: &[&str]) -> (Broker, Log) {
        let mut b = Self::start_inner(Some(toml), args, |c| {
            c.stderr(Stdio::piped());
        });
        let log = Log::of(&mut b);
        (b, log)
    }

    /// `http://HOST:PORT/mcp`: the URL a stock MCP client connects to.
    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.http)
    }

    pub fn connect(&self) -> Client {
        Client::connect(self.frames)
    }

    /// Sends SIGTERM without waiting.
    pub fn sigterm(&self) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc_kill(self.child.id() as i32, 15) };
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        self.sigterm();
        self.wait_exit(within)
    }

    /// Waits (bounded) for the exit that a stop signal sent before began:
    /// a second signal during the drain would end it at once.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "broker did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's resident set size in bytes (`VmRSS`).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("broker's /proc status");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS in /proc status");
        kb * 1024
    }

    /// The sum of every sample of `name` (any labels) in `/metrics`.
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.metric_where(name, &[])
    }

    /// The sum of the samples of `name` whose labels include every one of
    /// `labels` (each written `key="value"`).
    pub fn metric_where(&self, name: &str, labels: &[&str]) -> f64 {
        let (status, body) = self.http_get("/metrics");
        assert_eq!(status, 200);
        body.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(name)?;
                let (set, value) = match rest.strip_prefix('{') {
                    Some(labelled) => labelled.split_once("} ")?,
                    None => ("", rest.strip_prefix(' ')?),
                };
                let wanted = labels
                    .iter()
                    .all(|want| set.split(',').any(|pair| pair == *want));
                wanted.then(|| value.parse::<f64>().ok()).flatten()
            })
            .sum()
    }

    /// `mcp_requests_total` of `edge`'s requests of `kind` that ended in
    /// `outcome`.
    pub fn requests(&self, edge: &str, kind: &str, outcome: &str) -> f64 {
        let labels = [
            format!("edge=\"{edge}\""),
            format!("kind=\"{kind}\""),
            format!("outcome=\"{outcome}\""),
        ];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        self.metric_where("mcp_requests_total", &labels)
    }

    pub fn http_get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(self.metrics).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The endpoint keeps HTTP/1.1 connections alive: ask for the close
        // that ends the read below.
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        let status = body.split_whitespace().nth(1).unwrap().parse().unwrap();
        (
            status,
            body.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
        )
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the broker on `toml` (port 0 everywhere) expecting it to exit
/// without becoming ready; returns its stderr.
/// Runs `openssl` with `args` in `dir`, failing the test with its stderr
/// if it fails; its stdout.
pub fn openssl(dir: &std::path::Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(Stdio::piped())
        .output()
        .expect("openssl (scripts/setup installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// What a broker started with a piped stderr has logged so far, copied
/// by a thread that also passes it on to the test's stderr.
#[derive(Clone, Default)]
pub struct Log(std::sync::Arc<std::sync::Mutex<String>>);

impl Log {
    /// Takes `b`'s piped stderr (`c.stderr(Stdio::piped())` at its start).
    pub fn of(b: &mut Broker) -> Log {
        let mut stderr = b.child.stderr.take().expect("the broker's stderr is piped");
        let log = Log::default();
        let copy = log.0.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let s = String::from_utf8_lossy(&buf[..n]);
                eprint!("{s}");
                copy.lock().unwrap().push_str(&s);
            }
        });
        log
    }

    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// Whether `needle` is logged within `within`.
    pub fn shows(&self, needle: &str, within: Duration) -> bool {
        http::eventually(within, || self.0.lock().unwrap().contains(needle))
    }
}

pub fn fails_to_start(toml: &str) -> String {
    fails_to_start_with(toml, &PORT_ZERO)
}

/// [`fails_to_start`] with `args` in place of the port 0 flags.
pub fn fails_to_start_with(toml: &str, args: &[&str]) -> String {
    let path = std::env::temp_dir().join(format!(
        "mcp-broker-fails-{}-{}.toml",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::write(&path, toml).unwrap();
    let _remove = tempfile_path::TempPath(path.clone());
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-broker"))
        .arg("--config")
        .arg(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the broker neither failed nor exited within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!status.success(), "it started: {stderr}");
    assert!(out.stdout.is_empty(), "no ready line expected: {stderr}");
    stderr
}

/// A blocking frame client, over TCP or anything else that reads and
/// writes (a TLS stream, `tests/tls.rs`).
pub struct Client<S = TcpStream> {
    pub stream: S,
    pub enc: RequestEncoder,
    next: u64,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client::over(stream)
    }
}

impl<S: Read + Write> Client<S> {
    /// A client on an established stream.
    pub fn over(stream: S) -> Client<S> {
        Client {
            stream,
            enc: RequestEncoder::new(),
            next: 0,
        }
    }

    /// A header with a fresh correlation id `c<n>`.
    pub fn header(&mut self) -> (String, [u8; 16]) {
        self.next += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.next.to_be_bytes());
        (format!("c{}", self.next), id)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Reads one frame; `None` on EOF or reset.
    pub fn read_frame(&mut self) -> Option<Vec<u8>> {
        let mut len = [0u8; 4];
        if self.stream.read_exact(&mut len).is_err() {
            return None;
        }
        let n = u32::from_le_bytes(len) as usize;
        let mut f = vec![0u8; 4 + n];
        f[..4].copy_from_slice(&len);
        self.stream.read_exact(&mut f[4..]).ok()?;
        Some(f)
    }

    /// Reads frames until a final one (progress/log frames skipped).
    pub fn read_final(&mut self) -> Vec<u8> {
        loop {
            let f = self
                .read_frame()
                .expect("connection closed before a response");
            if ResponseView::parse(&f)
                .expect("response verifies")
                .is_final()
            {
                return f;
            }
        }
    }

    /// A tool-call frame with a fresh header, not sent; with its
    /// correlation id.
    pub fn tool_call_frame(
        &mut self,
        tool: &str,
        args: &[(&str, &str)],
        session: Option<&str>,
    ) -> (String, Vec<u8>) {
        let (corr, id) = self.header();
        let h = RequestHeader {
            message_id: id,
            correlation_id: Some(&corr),
            session_id: session,
            timeout_ms: 0,
            unix_nanos: 0,
        };
        let f = self.enc.tool_call(&h, id, tool, args).to_vec();
        (corr, f)
    }

    /// Calls a tool and returns the final response frame.
    pub fn call(
        &mut self,
        tool: &str,
        args: &[(&str, &str)],
        session: Option<&'static str>,
    ) -> Vec<u8> {
        let (corr, f) = self.tool_call_frame(tool, args, session);
        self.send_raw(&f);
        let resp = self.read_final();
        assert_eq!(ResponseView::parse(&resp).unwrap().correlation_id(), corr);
        resp
    }

    /// Sends a request built by `build` with a fresh header; its
    /// correlation id.
    fn send_built(
        &mut self,
        session: Option<&str>,
        build: impl FnOnce(&mut RequestEncoder, &RequestHeader) -> Vec<u8>,
    ) -> String {
        let (corr, id) = self.header();
        let h = RequestHeader {
            message_id: id,
            correlation_id: Some(&corr),
            session_id: session,
            timeout_ms: 0,
            unix_nanos: 0,
        };
        let f = build(&mut self.enc, &h);
        self.send_raw(&f);
        corr
    }

    /// Pings and returns the first frame that comes back: the ping's answer
    /// when nothing was queued for the connection before it, else what was
    /// (a notification [`Self::request`] would skip).
    pub fn first_after_ping(&mut self) -> Vec<u8> {
        self.send_built(None, |e, h| e.ping(h).to_vec());
        self.read_frame().expect("an answer to the ping")
    }

    /// Sends a request built by `build` with a fresh header and returns the
    /// final response.
    pub fn request(
        &mut self,
        session: Option<&'static str>,
        build: impl FnOnce(&mut RequestEncoder, &RequestHeader) -> Vec<u8>,
    ) -> Vec<u8> {
        let corr = self.send_built(session, build);
        let resp = self.read_final();
        assert_eq!(ResponseView::parse(&resp).unwrap().correlation_id(), corr);
        resp
    }
}

/// The first text block of a ToolResult response.
pub fn tool_text(frame: &[u8]) -> String {
    let r = ResponseView::parse(frame).unwrap();
    if let Some((code, msg)) = r.error() {
        panic!("error response {code}: {msg}");
    }
    let tr = r.response.payload_as_tool_result().expect("a ToolResult");
    let c = mcp_schema::content_vec::content(&tr).unwrap();
    match c.get(0) {
        mcp_schema::content_vec::ContentRef::Text(t) => t.text().to_string(),
        other => panic!("first block is not text: {other:?}"),
    }
}

/// The error code of an ErrorResponse, if it is one.
pub fn error_code(frame: &[u8]) -> Option<i32> {
    ResponseView::parse(frame).unwrap().error().map(|e| e.0)
}
