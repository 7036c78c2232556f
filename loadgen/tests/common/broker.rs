//! The real `mcp-broker` binary on loopback port 0, for the tests that
//! drive its gRPC and HTTP edges (`grpc.rs`, `http.rs`, and `tls.rs`
//! through a TLS proxy).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `mcp-broker` is built beside `mcp-loadgen` by `cargo test --workspace`.
pub fn broker_bin() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_mcp-loadgen")).with_file_name("mcp-broker");
    assert!(
        p.exists(),
        "{} is missing: build it first (`cargo build -p mcp-broker`, or run the tests with \
         `cargo test --workspace` / scripts/test)",
        p.display()
    );
    let echo = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../routers/target/wasm32-wasip2/release/echo.wasm"
    ));
    assert!(
        echo.exists(),
        "{} is missing: run scripts/build-routers first",
        echo.display()
    );
    p
}

/// The real broker on port 0 everywhere, killed on drop.
pub struct Broker {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

impl Broker {
    pub fn start() -> Broker {
        let mut child = Command::new(broker_bin())
            .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
            .args(["--http-listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0", "--shards", "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mcp-broker");
        let stdout = child.stdout.take().expect("piped stdout");
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
        assert!(line.starts_with("mcp-broker ready "), "{line}");
        let addr = |key: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in the ready line {line:?}"))
                .parse()
                .unwrap_or_else(|e| panic!("{key}: {e} in {line:?}"))
        };
        Broker {
            grpc: addr("grpc="),
            http: addr("http="),
            child,
        }
    }

    pub fn grpc_target(&self) -> String {
        format!("grpc://{}", self.grpc)
    }

    pub fn http_target(&self) -> String {
        format!("http://{}/mcp", self.http)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
