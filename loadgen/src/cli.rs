//! The command line, and its validation into a [`RunConfig`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use clap::Parser;

use crate::engine::RunConfig;
use crate::target::Target;
use crate::tls::{TlsClient, TlsFlags};
use crate::workload::Workload;

/// Largest response frame accepted (body bytes): the broker's default
/// request limit, so any legal echo of a legal request fits.
const DEFAULT_MAX_FRAME: u32 = mcp_schema::DEFAULT_MAX_FRAME_LEN;

fn duration(s: &str) -> Result<Duration, String> {
    crate::duration::parse(s)
}

#[derive(Parser, Debug)]
#[command(
    name = "mcp-loadgen",
    version,
    about = "Load generator for mcp-broker and any MCP Streamable HTTP server: closed or open \
             loop, coordinated-omission-free latency",
    after_help = "Open loop (--rate) is the honest measurement: latency is taken from each \
                  request's intended send time, so a stalled server cannot hide behind a \
                  generator that waited for it. http:// loads any MCP Streamable HTTP \
                  server: one session per connection, one request in flight per connection \
                  unless --pipeline. See docs/loadgen.md."
)]
pub struct Args {
    /// frames://HOST:PORT (the frame edge), grpc://HOST:PORT (the gRPC
    /// edge) or http://HOST:PORT/PATH (any MCP Streamable HTTP server;
    /// /mcp without a PATH): one MCP session per connection, JSON and
    /// SSE answers. Over TLS: frames+tls://, grpcs://, https://.
    #[arg(long)]
    pub target: String,

    /// Tool to call (with --args); conflicts with --workload.
    #[arg(long, conflicts_with = "workload")]
    pub tool: Option<String>,

    /// Tool arguments as a JSON object; each member becomes one argument
    /// whose value is that member's JSON text.
    #[arg(long, default_value = "{}", conflicts_with = "workload")]
    pub args: String,

    /// TOML workload file mixing tool calls, resource reads, prompt gets and
    /// list requests with weights and argument templates.
    #[arg(long)]
    pub workload: Option<PathBuf>,

    /// TCP connections, spread over the worker threads. http://: one MCP
    /// session each, and the requests in flight (times --pipeline).
    #[arg(long, default_value_t = 1)]
    pub connections: usize,

    /// Closed loop: total requests in flight (split over connections). With
    /// --rate: a cap on requests in flight. http://: always --connections ×
    /// --pipeline.
    #[arg(long)]
    pub concurrency: Option<u64>,

    /// http:// only: requests in flight per connection (HTTP/1.1
    /// pipelining, answers in order). Default 1: no pipelining, so
    /// --connections is the concurrency. The server must answer pipelined
    /// requests (RFC 9112 requires it; not every server does).
    #[arg(long, default_value_t = 1)]
    pub pipeline: u64,

    /// http:// only: the MCP protocol revision to speak. `2025-11-25` (the
    /// default): `initialize`, then every request in its session.
    /// `2026-07-28`: no session; each POST carries `MCP-Protocol-Version`,
    /// `Mcp-Method`, `Mcp-Name` and the request's `_meta`.
    #[arg(long, default_value = crate::http::PROTOCOL_VERSION)]
    pub mcp_version: String,

    /// Open loop: requests per second over all connections, sent on
    /// schedule whatever the server does.
    #[arg(long)]
    pub rate: Option<f64>,

    /// Grow the rate linearly from 0 to --rate over this long.
    #[arg(long, value_parser = duration, requires = "rate")]
    pub ramp: Option<Duration>,

    /// Length of the measured phase (after the warmup), e.g. 10s, 1m.
    /// Default 10s unless --requests is given.
    #[arg(long, value_parser = duration)]
    pub duration: Option<Duration>,

    /// Stop after sending this many requests (warmup included).
    #[arg(long)]
    pub requests: Option<u64>,

    /// Run this long before measuring; those requests are not reported.
    #[arg(long, value_parser = duration, default_value = "0s")]
    pub warmup: Duration,

    /// Worker threads (one monoio runtime each; grpc://: one tokio runtime
    /// each). Default 1, or one per CPU given to --cpus.
    #[arg(long)]
    pub threads: Option<usize>,

    /// Pin worker threads to these CPUs, e.g. `2,3` or `2-3`, to keep the
    /// generator off the server's cores.
    #[arg(long)]
    pub cpus: Option<String>,

    /// A request without a final response after this long counts as a
    /// timeout error (and frees its window slot; http://: its connection is
    /// dropped and reopened, the session kept).
    #[arg(long, value_parser = duration, default_value = "30s")]
    pub timeout: Duration,

    /// After the last send, wait at most this long for outstanding
    /// responses; the rest count as timeouts.
    #[arg(long, value_parser = duration, default_value = "5s")]
    pub drain: Duration,

    /// Write the JSON report here (also when the run fails).
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Write an HdrHistogram interval log (one histogram per second) here.
    #[arg(long)]
    pub hlog: Option<PathBuf>,

    /// Open loop: yield-spin this long (plus the timer's 2 ms slack) before
    /// each scheduled send instead of trusting the millisecond timer: costs
    /// CPU, buys send times within microseconds. One task per worker thread
    /// spins for all its connections (`alarm.rs`). 0 = timer only (sends up
    /// to ~2 ms late).
    #[arg(long, value_parser = duration, default_value = "200us")]
    pub spin: Duration,

    /// Largest response frame body accepted, in bytes (gRPC: message;
    /// http://: response body or SSE event).
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME)]
    pub max_frame: u32,

    /// The bearer token for a broker running `[auth]`, read from this file
    /// (not a flag, so that it stays out of process listings). http(s)://:
    /// `Authorization: Bearer <token>` on every request; grpc(s)://:
    /// `authorization` metadata on every call; frames(+tls)://: each
    /// connection's initialize carries it (a refusal fails the run).
    #[arg(long)]
    pub bearer_file: Option<PathBuf>,

    /// TLS targets: PEM CA bundle that verifies the server's certificate.
    /// Default: the public web (webpki) roots, which a private broker
    /// certificate is not signed by.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// TLS targets: the name the server's certificate must carry (and the
    /// SNI). Default: the target's host; an IP address is verified as an
    /// IP SAN.
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,

    /// TLS targets: client certificate chain (PEM) for mTLS; with
    /// --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// TLS targets: the client certificate's private key (PEM); with
    /// --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Seed for workload choices and argument templates.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `2,3` / `0-3` / `0-1,6` → CPU numbers.
pub fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("--cpus `{s}`: `{part}` is not a CPU number or range");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    if out.is_empty() {
        return Err(format!("--cpus `{s}` names no CPU"));
    }
    Ok(out)
}

impl Args {
    /// Checks everything and reports every problem at once.
    pub fn validate(&self) -> anyhow::Result<RunConfig> {
        let mut problems = Vec::new();
        let target = Target::parse(&self.target)
            .map_err(|e| problems.push(e))
            .ok();
        let cpus = match self.cpus.as_deref().map(parse_cpus) {
            Some(Err(e)) => {
                problems.push(e);
                None
            }
            Some(Ok(c)) => Some(c),
            None => None,
        };
        let threads = self
            .threads
            .unwrap_or_else(|| cpus.as_ref().map_or(1, Vec::len));
        if threads == 0 {
            problems.push("--threads must be at least 1".into());
        }
        if self.connections == 0 {
            problems.push("--connections must be at least 1".into());
        } else if threads > self.connections {
            problems.push(format!(
                "--threads {threads} is more than --connections {}: each thread needs a connection",
                self.connections
            ));
        }
        let http = target
            .as_ref()
            .is_some_and(|t| t.scheme == crate::target::Scheme::Http);
        let per_conn = self.pipeline.max(1);
        if self.mcp_version != crate::http::PROTOCOL_VERSION {
            if !crate::http::SUPPORTED_VERSIONS.contains(&self.mcp_version.as_str()) {
                problems.push(format!(
                    "--mcp-version {}: expected one of {}",
                    self.mcp_version,
                    crate::http::SUPPORTED_VERSIONS.join(", ")
                ));
            } else if !http && target.is_some() {
                problems.push("--mcp-version is for http:// and https:// targets only".into());
            }
        }
        if self.pipeline == 0 {
            problems.push("--pipeline must be at least 1".into());
        } else if self.pipeline > 1 && !http && target.is_some() {
            problems.push("--pipeline is for http:// targets only".into());
        }
        if http
            && let Some(c) = self.concurrency
            && c != self.connections as u64 * per_conn
        {
            problems.push(format!(
                "--concurrency {c}: an http:// connection carries --pipeline {per_conn} \
                 request(s) at a time (HTTP/1.1), so the concurrency is --connections × \
                 --pipeline = {}; set --connections (and --pipeline) instead",
                self.connections as u64 * per_conn
            ));
        } else if let Some(c) = self.concurrency
            && c < self.connections as u64
        {
            problems.push(format!(
                "--concurrency {c} is less than --connections {}: a connection would carry nothing",
                self.connections
            ));
        }
        if let Some(r) = self.rate
            && !(r.is_finite() && r > 0.0)
        {
            problems.push(format!(
                "--rate must be a positive number of requests/s, not {r}"
            ));
        }
        if self.requests == Some(0) {
            problems.push("--requests must be at least 1".into());
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            problems.push("--duration must be longer than 0".into());
        }
        if self.timeout.is_zero() {
            problems.push("--timeout must be longer than 0".into());
        }
        let workload = match (&self.tool, &self.workload) {
            (Some(tool), None) => Workload::tool(tool, &self.args)
                .map_err(|e| problems.push(format!("{e:#}")))
                .ok(),
            (None, Some(path)) => match std::fs::read_to_string(path) {
                Ok(text) => Workload::from_toml(&text)
                    .map_err(|e| problems.push(format!("workload {}: {e:#}", path.display())))
                    .ok(),
                Err(e) => {
                    problems.push(format!("cannot read workload {}: {e}", path.display()));
                    None
                }
            },
            _ => {
                problems
                    .push("say what to send: --tool NAME [--args JSON] or --workload FILE".into());
                None
            }
        };
        let flags = self.tls_flags();
        let tls = match &target {
            Some(t) if t.tls => match TlsClient::new(t, &flags) {
                Ok(c) => Some(Arc::new(c)),
                Err(e) => {
                    problems.push(e);
                    None
                }
            },
            Some(t) if flags.any() => {
                problems.push(format!(
                    "--tls-ca, --tls-server-name, --tls-cert and --tls-key are for TLS targets \
                     only ({}://…); `{}` is plaintext",
                    t.scheme.tls_str(),
                    t.scheme_str()
                ));
                None
            }
            _ => None,
        };
        let (Some(target), Some(workload), true) = (target, workload, problems.is_empty()) else {
            bail!("{}", problems.join("\n"));
        };
        let concurrency = match (self.concurrency, self.rate) {
            // One request in flight per HTTP/1.1 connection, in every
            // mode: with --rate that is the rate-limited closed loop.
            _ if target.scheme == crate::target::Scheme::Http => {
                Some(self.connections as u64 * self.pipeline)
            }
            (None, None) => Some(self.connections as u64),
            (c, _) => c,
        };
        let bearer = match &self.bearer_file {
            None => None,
            Some(p) => {
                let t = std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("--bearer-file {}: {e}", p.display()))?;
                let t = t.trim().to_owned();
                if t.is_empty() || !t.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
                    anyhow::bail!(
                        "--bearer-file {}: not one token of visible ASCII",
                        p.display()
                    );
                }
                Some(t)
            }
        };
        let duration = match (self.duration, self.requests) {
            (None, None) => Some(Duration::from_secs(10)),
            (d, _) => d,
        };
        Ok(RunConfig {
            target,
            workload: Arc::new(workload),
            threads,
            cpus,
            connections: self.connections,
            concurrency,
            rate: self.rate,
            ramp: self.ramp.unwrap_or_default(),
            duration,
            requests: self.requests,
            warmup: self.warmup,
            timeout: self.timeout,
            drain: self.drain,
            spin: self.spin,
            max_frame: self.max_frame,
            seed: self.seed,
            bearer,
            tls,
            mcp_version: self.mcp_version.clone(),
        })
    }

    fn tls_flags(&self) -> TlsFlags {
        TlsFlags {
            ca: self.tls_ca.clone(),
            server_name: self.tls_server_name.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["mcp-loadgen", "--target", "frames://127.0.0.1:7400"];
        v.extend_from_slice(extra);
        Args::try_parse_from(v).unwrap()
    }

    #[test]
    fn cpu_lists_and_ranges() {
        assert_eq!(parse_cpus("2,3"), Ok(vec![2, 3]));
        assert_eq!(parse_cpus("0-2,6"), Ok(vec![0, 1, 2, 6]));
        assert!(parse_cpus("3-1").is_err());
        assert!(parse_cpus("x").is_err());
        assert!(parse_cpus("").is_err());
    }

    #[test]
    fn defaults_are_closed_loop_for_ten_seconds() {
        let c = args(&["--tool", "echo"]).validate().unwrap();
        assert_eq!(c.mode(), crate::engine::Mode::Closed);
        assert_eq!(c.concurrency, Some(1));
        assert_eq!(c.duration, Some(Duration::from_secs(10)));
        assert_eq!(c.threads, 1);
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let e = Args::try_parse_from([
            "mcp-loadgen",
            "--target",
            "tcp://x",
            "--connections",
            "2",
            "--concurrency",
            "1",
            "--rate=-5",
        ])
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
        for needle in ["unknown scheme", "--concurrency 1", "--rate", "--tool NAME"] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
    }

    #[test]
    fn http_concurrency_is_the_connection_count() {
        let parse = |extra: &[&str]| {
            let mut v = vec!["mcp-loadgen", "--target", "http://127.0.0.1:8000/mcp"];
            v.extend_from_slice(extra);
            Args::try_parse_from(v).unwrap().validate()
        };
        let c = parse(&["--tool", "echo", "--connections", "8", "--rate", "100"]).unwrap();
        assert_eq!(c.concurrency, Some(8));
        assert_eq!(c.mode(), crate::engine::Mode::RateLimited);
        let c = parse(&["--tool", "echo", "--connections", "3"]).unwrap();
        assert_eq!(
            (c.concurrency, c.mode()),
            (Some(3), crate::engine::Mode::Closed)
        );
        let e = parse(&["--tool", "echo", "--concurrency", "64"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--connections × --pipeline = 1"), "{e}");
        let c = parse(&["--tool", "echo", "--connections", "4", "--pipeline", "8"]).unwrap();
        assert_eq!(c.concurrency, Some(32));
        let e = Args::try_parse_from([
            "mcp-loadgen",
            "--target",
            "frames://127.0.0.1:7400",
            "--tool",
            "echo",
            "--pipeline",
            "2",
        ])
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("http:// targets only"), "{e}");
    }

    fn parse_for(target: &str, extra: &[&str]) -> anyhow::Result<RunConfig> {
        let mut v = vec!["mcp-loadgen", "--target", target, "--tool", "echo"];
        v.extend_from_slice(extra);
        Args::try_parse_from(v).unwrap().validate()
    }

    #[test]
    fn tls_targets_build_one_client_config_and_plain_ones_refuse_tls_flags() {
        // No --tls-ca: the webpki roots; the name is the target's host.
        for (t, alpn) in [
            ("https://127.0.0.1:7403/mcp", vec![b"http/1.1".to_vec()]),
            ("frames+tls://localhost:7400", vec![]),
            ("grpcs://[::1]:7401", vec![]),
        ] {
            let c = parse_for(t, &[]).unwrap();
            let tls = c.tls.expect("a TLS target has a TLS client");
            assert!(!tls.custom_ca);
            assert_eq!(tls.config.alpn_protocols, alpn, "{t}");
            let host = c.target.host.clone();
            assert_eq!(tls.server_name.to_str(), host.as_str());
        }
        // An IP host is verified as an IP address (no SNI).
        let c = parse_for("frames+tls://127.0.0.1:7400", &[]).unwrap();
        assert!(matches!(
            c.tls.unwrap().server_name,
            rustls::pki_types::ServerName::IpAddress(_)
        ));
        let c = parse_for(
            "frames+tls://127.0.0.1:7400",
            &["--tls-server-name", "broker.internal"],
        )
        .unwrap();
        assert_eq!(c.tls.unwrap().server_name.to_str(), "broker.internal");
        assert!(
            parse_for("frames://127.0.0.1:7400", &[])
                .unwrap()
                .tls
                .is_none()
        );
        for t in [
            "frames://127.0.0.1:7400",
            "grpc://127.0.0.1:7401",
            "http://127.0.0.1:7403/mcp",
        ] {
            for flag in ["--tls-ca", "--tls-server-name", "--tls-cert", "--tls-key"] {
                let e = parse_for(t, &[flag, "x"]).unwrap_err().to_string();
                assert!(e.contains("for TLS targets only"), "{t} {flag}: {e}");
            }
        }
    }

    #[test]
    fn tls_files_are_checked_up_front() {
        let dir = std::env::temp_dir().join(format!("loadgen-cli-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let junk = junk.to_str().unwrap();
        let t = "frames+tls://127.0.0.1:7400";
        for (extra, needle) in [
            (vec!["--tls-ca", junk], "no PEM certificate"),
            (
                vec!["--tls-ca", "/nonexistent/ca.pem"],
                "--tls-ca /nonexistent/ca.pem",
            ),
            (vec!["--tls-cert", junk], "give both"),
            (vec!["--tls-key", junk], "give both"),
            (vec!["--tls-cert", junk, "--tls-key", junk], "--tls-cert"),
            (
                vec!["--tls-server-name", "not a name!"],
                "neither a DNS name",
            ),
        ] {
            let e = parse_for(t, &extra).unwrap_err().to_string();
            assert!(e.contains(needle), "{extra:?}: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bearer_tokens_go_to_every_target_read_once_and_trimmed() {
        let dir = std::env::temp_dir().join(format!("loadgen-cli-bearer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok");
        std::fs::write(&ok, "  tok.en-1_x\n\n").unwrap();
        let ok = ok.to_str().unwrap();
        for t in [
            "http://127.0.0.1:7403/mcp",
            "https://127.0.0.1:7403/mcp",
            "frames://127.0.0.1:7400",
            "frames+tls://127.0.0.1:7400",
            "grpc://127.0.0.1:7401",
            "grpcs://127.0.0.1:7401",
        ] {
            let c = parse_for(t, &["--bearer-file", ok]).unwrap();
            assert_eq!(c.bearer.as_deref(), Some("tok.en-1_x"), "{t}");
            assert!(parse_for(t, &[]).unwrap().bearer.is_none(), "{t}");
        }
        // Not one token of visible ASCII, or no file: refused for every
        // scheme, before anything connects.
        for (content, what) in [
            ("", "empty"),
            ("  \n", "blank"),
            ("two tokens", "a space inside"),
            ("tok\u{e9}", "non-ASCII"),
            ("a\tb", "a tab inside"),
        ] {
            let p = dir.join("bad");
            std::fs::write(&p, content).unwrap();
            for t in [
                "frames://127.0.0.1:7400",
                "grpc://127.0.0.1:7401",
                "http://127.0.0.1:7403/mcp",
            ] {
                let e = parse_for(t, &["--bearer-file", p.to_str().unwrap()])
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.contains("not one token of visible ASCII"),
                    "{t} {what}: {e}"
                );
            }
        }
        let e = parse_for(
            "grpc://127.0.0.1:7401",
            &["--bearer-file", "/nonexistent/tok"],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--bearer-file /nonexistent/tok"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cpus_set_the_thread_count() {
        let c = args(&["--tool", "echo", "--connections", "4", "--cpus", "0-1"])
            .validate()
            .unwrap();
        assert_eq!(c.threads, 2);
    }
}
