//! The real `mcp-broker` binary on loopback port 0, for the tests that
//! drive its gRPC edge (`grpc.rs`, and `tls.rs` through a TLS proxy).

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
}

impl Broker {
    pub fn start() -> Broker {
        let mut child = Command::new(broker_bin())
            .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
            .args([
                "--http-listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(["--shards", "2"])
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
        let mut b = Broker {
            child,
            grpc: "0.0.0.0:0".parse().unwrap(),
        };
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("mcp-broker printed no ready line within 120 s");
        assert!(line.starts_with("mcp-broker ready "), "{line}");
        b.grpc = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("grpc="))
            .unwrap_or_else(|| panic!("no grpc= in ready line {line:?}"))
            .parse()
            .expect("grpc=HOST:PORT");
        b
    }

    pub fn target(&self) -> String {
        format!("grpc://{}", self.grpc)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
