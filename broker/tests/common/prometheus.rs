//! A real Prometheus on loopback (Debian's `prometheus` package), for the
//! tests that check what it makes of the broker's metrics: scraped counts
//! and quantiles (`metrics_prometheus.rs`), and the shipped rules
//! (`prometheus_rules.rs`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const INSTALL_HINT: &str = "install Debian's `prometheus` package (it provides `prometheus` and `promtool`): run scripts/setup, or `apt-get install prometheus`";

/// Where `name` is on the PATH; panics with the install hint when it is not.
pub fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| panic!("`{name}` is not on the PATH: {INSTALL_HINT}"))
}

/// A scratch directory removed (with everything in it) on drop.
pub fn scratch(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("{tag}-"))
        .tempdir()
        .expect("a scratch directory")
}

/// Prometheus on a loopback port, scraping `target` every second; killed on
/// drop.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(target: SocketAddr) -> Self {
        Self::with_rules(target, &[])
    }

    /// [`Prometheus::start`], loading `rule_files` (evaluated every second).
    pub fn with_rules(target: SocketAddr, rule_files: &[&Path]) -> Self {
        let bin = tool("prometheus");
        let dir = scratch("mcp-prometheus");
        let config = dir.path().join("prometheus.yml");
        let rules: String = rule_files
            .iter()
            .map(|f| format!("  - '{}'\n", f.display()))
            .collect();
        let rules = if rules.is_empty() {
            String::new()
        } else {
            format!("rule_files:\n{rules}")
        };
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 {rules}\
                 scrape_configs:\n  - job_name: mcp-broker\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // A free loopback port: bound and released; Prometheus failing to
        // bind it (a race with another process) shows in its log below.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let mut p = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!("prometheus exited ({status}): {}", p.log());
            }
            if http(p.addr, "/-/ready").is_some_and(|(s, _)| s == 200) {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 60 s: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` of the HTTP API, parsed; panics unless it succeeded.
    pub fn api(&self, path: &str) -> serde_json::Value {
        let (status, body) = http(self.addr, path)
            .unwrap_or_else(|| panic!("{path}: prometheus did not answer: {}", self.log()));
        assert_eq!(status, 200, "{path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{path}: {body}");
        v
    }

    /// An instant query's single value, if it has one.
    pub fn query(&self, promql: &str) -> Option<f64> {
        let (status, body) = http(
            self.addr,
            &format!("/api/v1/query?query={}", urlencode(promql)),
        )?;
        assert_eq!(status, 200, "{promql}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{promql}: {body}");
        let result = v["data"]["result"].as_array()?;
        assert!(result.len() <= 1, "{promql}: several series: {body}");
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Polls `promql` until `ok(value)` or a 30 s deadline; the last value.
    pub fn wait_for(&self, promql: &str, ok: impl Fn(f64) -> bool) -> Option<f64> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.query(promql);
            if v.is_some_and(&ok) || Instant::now() >= deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A bounded HTTP/1.0 GET on loopback: (status, body), or `None` when the
/// server does not answer.
pub fn http(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n")?.1.to_string()))
}

/// `promtool check metrics` on `exposition`: its complaints, if any.
pub fn promtool_check(exposition: &str) -> (bool, String) {
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
