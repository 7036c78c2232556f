//! Shared by the gRPC edge tests: start the real `mcp-broker` on port 0,
//! read its ready line, and kill it when the guard is dropped.
//!
//! The bundled routers must be built first (`scripts/build-routers`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

/// A running broker; dropping it kills the process.
pub struct Broker {
    pub child: Child,
    pub grpc: SocketAddr,
    pub frames: SocketAddr,
    pub metrics: SocketAddr,
    _config: Option<tempfile_like::TempFile>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Broker {
    /// Starts the broker on the embedded default plus the `chaos` router
    /// (ports 0, two shards).
    pub fn start() -> Self {
        Self::start_with_config(|c| c)
    }

    /// Starts it on the example configuration plus the `chaos` router
    /// (`tests/fixtures/chaos.toml`; chaos is not served by default), with
    /// `edit` applied to the text (e.g. to change `[grpc]` limits).
    pub fn start_with_config(edit: impl FnOnce(String) -> String) -> Self {
        let base = format!(
            "{}\n{}",
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/broker.example.toml"))
                .unwrap(),
            include_str!("../fixtures/chaos.toml")
        );
        Self::start_with(Some(edit(base)))
    }

    /// [`Broker::start_with_config`] with the `chaos` router served for
    /// sure (the embedded default need not serve it), with `chaos` as the
    /// last `[[routers]]` entry so that `edit` can append keys to it.
    pub fn start_with_chaos(edit: impl FnOnce(String) -> String) -> Self {
        Self::start_with_chaos_env(edit, &[])
    }

    /// [`Broker::start_with_chaos`] with `env` set for the broker (e.g. the
    /// debug build's fault injection, `src/fault.rs`).
    pub fn start_with_chaos_env(edit: impl FnOnce(String) -> String, env: &[(&str, &str)]) -> Self {
        let mut text = example();
        if let Some(at) = text.find("[[routers]]\nname = \"chaos\"") {
            text.truncate(at);
        }
        text.push_str("\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\n");
        Self::start_with_env(Some(edit(text)), env)
    }

    fn start_with(config: Option<String>) -> Self {
        Self::start_with_env(config, &[])
    }

    fn start_with_env(config: Option<String>, env: &[(&str, &str)]) -> Self {
        let file = config.map(|text| tempfile_like::TempFile::new("grpc-test.toml", &text));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-broker"));
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--shards",
            "2",
        ]);
        if let Some(f) = &file {
            cmd.arg("--config").arg(&f.path);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning mcp-broker");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        // Blocks until the ready line (or EOF if start-up failed).
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let mut broker = Broker {
            child,
            grpc: "0.0.0.0:0".parse().unwrap(),
            frames: "0.0.0.0:0".parse().unwrap(),
            metrics: "0.0.0.0:0".parse().unwrap(),
            _config: file,
        };
        assert!(
            line.starts_with("mcp-broker ready "),
            "no ready line (are the routers built? scripts/build-routers): {line:?}"
        );
        for word in line.split_whitespace() {
            if let Some((k, v)) = word.split_once('=') {
                match k {
                    "grpc" => broker.grpc = v.parse().unwrap(),
                    "frames" => broker.frames = v.parse().unwrap(),
                    "metrics" => broker.metrics = v.parse().unwrap(),
                    _ => {}
                }
            }
        }
        assert_ne!(broker.grpc.port(), 0, "{line}");
        broker
    }

    pub fn uri(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// `/metrics`: the sum of every sample of `name` whose labels contain
    /// `label` (e.g. `router="chaos"`; "" for all).
    pub fn metric(&self, name: &str, label: &str) -> f64 {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.metrics).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(series, _)| {
                let (n, labels) = series.split_once('{').unwrap_or((series, ""));
                n == name && labels.contains(label)
            })
            .filter_map(|(_, v)| v.parse::<f64>().ok())
            .sum()
    }

    /// Sends SIGTERM (drain) without waiting.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

fn example() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/broker.example.toml")).unwrap()
}

/// A file removed on drop, without a dependency for it.
mod tempfile_like {
    use std::path::PathBuf;

    pub struct TempFile {
        pub path: PathBuf,
    }

    impl TempFile {
        pub fn new(name: &str, text: &str) -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path =
                std::env::temp_dir().join(format!("mcp-broker-{}-{n}-{name}", std::process::id()));
            std::fs::write(&path, text).unwrap();
            Self { path }
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
