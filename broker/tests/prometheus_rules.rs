//! The Prometheus rules shipped in `deploy/prometheus/`: promtool accepts
//! them and their unit tests pass; every metric they name is one the broker
//! exports (with `[tls]`, `[auth]` and an upstream router, so that every
//! family is there); and a real Prometheus scraping a real broker evaluates
//! every rule without an error and raises `McpUpstreamUnavailable` for an
//! upstream that is down.
//!
//! Needs Debian's `prometheus` package (`prometheus` and `promtool` on the
//! PATH), as `metrics_prometheus.rs` does; without it these tests fail.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::prometheus::{Prometheus, scratch, tool};
use common::{Broker, DeadPort};

const RULES: &str = "mcp-broker.rules.yml";

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

/// promtool run in the rules' directory: (succeeded, what it printed).
fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new(tool("promtool"))
        .args(args)
        .current_dir(rules_dir())
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let (ok, out) = promtool(&["check", "rules", RULES]);
    assert!(ok, "promtool check rules: {out}");
    let (ok, out) = promtool(&["test", "rules", "mcp-broker.rules.test.yml"]);
    assert!(ok, "promtool test rules: {out}");
}

/// Every `mcp_…` name in `text` that is not part of a recorded series'
/// name (`job_router:mcp_requests:rate5m`): the metrics the rules read, and
/// those their annotations point to.
fn metric_names(text: &str) -> BTreeSet<&str> {
    let part = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("mcp_") {
        let start = from + at;
        let len = bytes[start..].iter().take_while(|&&c| part(c)).count();
        if start == 0 || !part(bytes[start - 1]) {
            names.insert(&text[start..start + len]);
        }
        from = start + len;
    }
    names
}

/// The metric families of an exposition (its `# TYPE` lines).
fn families(exposition: &str) -> BTreeSet<&str> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// The broker with every optional family of metrics: `[tls]` (dev
/// certificates), `[auth]` (a JWK Set file) and an upstream router,
/// `weather`, whose MCP server is down (`down` holds its port).
fn broker_with_every_family(dir: &Path, down: &DeadPort) -> Broker {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let ok = Command::new("bash")
        .arg(repo.join("scripts/dev-certs"))
        .arg(dir)
        .status()
        .expect("bash")
        .success();
    assert!(ok, "scripts/dev-certs {} failed", dir.display());
    let key = common::jwt::rsa_key(dir, "issuer");
    let jwks = dir.join("jwks.json");
    std::fs::write(
        &jwks,
        serde_json::json!({"keys": [common::jwt::jwk("k1", &key)]}).to_string(),
    )
    .unwrap();
    let toml = format!(
        r#"{default}
[tls]
cert_file = "{cert}"
key_file = "{key}"

[auth]
issuer = "https://issuer.test"
audience = "https://mcp.test/mcp"
jwks_file = "{jwks}"

[[routers]]
name = "weather"
upstream = "http://127.0.0.1:{port}/mcp"
"#,
        default = mcp_broker::config::DEFAULT_TOML,
        cert = dir.join("server.pem").display(),
        key = dir.join("server.key").display(),
        jwks = jwks.display(),
        port = down.port,
    );
    Broker::start_with_config(&toml, &[])
}

#[test]
fn a_real_prometheus_evaluates_every_rule_against_a_real_broker() {
    tool("promtool");
    let dir = scratch("mcp-rules");
    let down = DeadPort::any();
    let broker = broker_with_every_family(dir.path(), &down);

    // Every metric the rules name is one this broker exports: a renamed
    // or misspelt metric would leave an alert that can never fire.
    let rules = std::fs::read_to_string(rules_dir().join(RULES)).unwrap();
    let (status, exposition) = broker.http_get("/metrics");
    assert_eq!(status, 200);
    let exported = families(&exposition);
    let named = metric_names(&rules);
    assert!(named.len() >= 15, "too few metric names found: {named:?}");
    let unknown: Vec<_> = named
        .iter()
        .filter(|n| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s).filter(|f| exported.contains(f)));
            !exported.contains(*n) && family.is_none()
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "{RULES} names metrics the broker does not export: {unknown:?}\nexported: {exported:?}"
    );

    // A real Prometheus loads the rules and scrapes the broker.
    let prom = Prometheus::with_rules(broker.metrics, &[&rules_dir().join(RULES)]);
    let up = prom.wait_for("up{job=\"mcp-broker\"}", |v| v == 1.0);
    assert_eq!(up, Some(1.0), "never scraped the broker: {}", prom.log());

    // Both groups evaluated on scraped series: a recorded series exists
    // (the instances gauge needs no traffic), and the upstream's alert is
    // raised (below). Then no rule may have an error: a query Prometheus
    // refuses on real series, such as a many-to-many match, shows only
    // here, and only once series are there.
    let recorded = prom.wait_for(
        "count(instance_router:mcp_router_instances_busy:ratio)",
        |v| v > 0.0,
    );
    let upstream_alert =
        |a: &serde_json::Value| a["labels"]["alertname"] == "McpUpstreamUnavailable";
    let deadline = Instant::now() + Duration::from_secs(30);
    let alerts = loop {
        let alerts = prom.api("/api/v1/alerts")["data"]["alerts"]
            .as_array()
            .unwrap()
            .clone();
        if alerts.iter().any(upstream_alert) || Instant::now() > deadline {
            break alerts;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let rules: Vec<serde_json::Value> = prom.api("/api/v1/rules")["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect();
    let in_file = std::fs::read_to_string(rules_dir().join("mcp-broker.rules.yml"))
        .unwrap()
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("- alert:") || l.starts_with("- record:")
        })
        .count();
    assert_eq!(rules.len(), in_file, "rules loaded: {rules:#?}");
    for r in &rules {
        assert_eq!(
            r["health"], "ok",
            "{}: {} ({})",
            r["name"], r["lastError"], r["query"]
        );
    }
    assert!(
        recorded.is_some_and(|n| n > 0.0),
        "no busy-instance ratio recorded: {}",
        prom.log()
    );

    // The upstream is down: its gauge is 0 and the alert is pending (its
    // `for` is 5 minutes). Nothing else alerts on a healthy broker, but for
    // a stalled shard, which a loaded test machine can truly cause.
    let (upstream, others): (Vec<_>, Vec<_>) = alerts.iter().partition(|a| upstream_alert(a));
    let others: Vec<_> = others
        .into_iter()
        .filter(|a| a["labels"]["alertname"] != "McpShardStalled")
        .collect();
    assert!(others.is_empty(), "{others:#?}");
    assert_eq!(upstream.len(), 1, "{alerts:#?}");
    let a = upstream[0];
    assert_eq!(a["labels"]["router"], "weather", "{a:#}");
    assert_eq!(a["labels"]["job"], "mcp-broker", "{a:#}");
    assert_eq!(a["state"], "pending", "{a:#}");
}
