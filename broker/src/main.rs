//! `mcp-broker`: see `mcp-broker --help` and README.md.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mcp_broker::config::{Config, Overrides};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A zero-copy, thread-per-core broker for the Model Context Protocol.
///
/// With no arguments it runs the bundled routers on the embedded default
/// configuration (frames 127.0.0.1:7400, gRPC :7401, metrics :7402, MCP
/// Streamable HTTP http://127.0.0.1:7403/mcp).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// TOML configuration file (see broker/broker.example.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Frame edge address (overrides frames.listen); port 0 = any.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// gRPC edge address (overrides grpc.listen).
    #[arg(long)]
    grpc_listen: Option<SocketAddr>,
    /// MCP Streamable HTTP edge address (overrides http.listen); the
    /// endpoint is `/mcp`.
    #[arg(long)]
    http_listen: Option<SocketAddr>,
    /// Metrics/admin HTTP address (overrides metrics.listen).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Shards (overrides broker.shards; 0 = one per core).
    #[arg(long)]
    shards: Option<usize>,
    /// Print the embedded default configuration and exit.
    #[arg(long)]
    print_default_config: bool,
    /// Log line format on stderr: `text`, or `json` (one object per line:
    /// timestamp, level, target, fields) for log shippers.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The WASM compiler's log targets: tens of thousands of lines at `debug`
/// and `trace` per component compiled.
const COMPILER_TARGETS: [&str; 4] = [
    "cranelift_codegen",
    "cranelift_frontend",
    "wasmtime_internal_cranelift",
    "regalloc2",
];

/// The log filter from `RUST_LOG` (`info` without one), and why a
/// `RUST_LOG` that does not parse was set aside. The WASM compiler's debug
/// lines (tens of thousands per component at start-up) would bury the
/// broker's own and overrun the log queue: each stays at `info` unless
/// `RUST_LOG` names it.
fn log_filter(spec: Option<String>) -> (tracing_subscriber::EnvFilter, Option<String>) {
    use tracing_subscriber::EnvFilter;
    let Some(spec) = spec.filter(|s| !s.trim().is_empty()) else {
        return (EnvFilter::new("info"), None);
    };
    // Each compiler target `RUST_LOG` does not name itself (a directive
    // for one of them keeps the others quiet).
    let mut full = spec;
    for target in COMPILER_TARGETS {
        if !full.contains(target) {
            full.push_str(&format!(",{target}=info"));
        }
    }
    match EnvFilter::try_new(&full) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e.to_string())),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_default_config {
        print!("{}", mcp_broker::config::DEFAULT_TOML);
        return ExitCode::SUCCESS;
    }
    // Signals are caught from the first moment, so that none is lost while
    // the config loads and the routers start.
    let signals = match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mcp-broker: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Colour only for a terminal: a log file or the journal (docs/deploy.md's
    // systemd unit) gets plain text. NO_COLOR turns it off on a terminal too.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    // Log lines go to stderr from a thread of their own, dropped when 128 Ki
    // of them wait: a reader that stops reading (a stalled log shipper)
    // must not block a shard in write(2), and one that is gone (EPIPE) must
    // not kill the broker, which the subscriber's own report of the failed
    // write did (eprintln! panics on a closed stderr, and a shard's
    // death notice, logged while panicking, aborted the process). The guard
    // writes what is queued at exit, waiting at most a second.
    let (log_writer, log_guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .thread_name("log")
        .finish(std::io::stderr());
    let _ = mcp_broker::metrics::LOG_DROPPED.set(log_writer.error_counter());
    let (filter, bad_filter) = log_filter(std::env::var("RUST_LOG").ok());
    let logs = tracing_subscriber::fmt()
        .with_writer(log_writer)
        .log_internal_errors(false)
        .with_env_filter(filter);
    match cli.log_format {
        LogFormat::Text => logs.with_ansi(ansi).init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
    if let Some(e) = bad_filter {
        tracing::warn!(error = %e, "RUST_LOG cannot be read; logging at info");
    }
    let overrides = Overrides {
        listen: cli.listen,
        grpc_listen: cli.grpc_listen,
        http_listen: cli.http_listen,
        metrics_listen: cli.metrics_listen,
        shards: cli.shards,
    };
    let source = mcp_broker::control::Source {
        path: cli.config.clone(),
        overrides: overrides.clone(),
    };
    let config = match Config::load(cli.config.as_deref(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcp-broker: {e}");
            return ExitCode::from(2);
        }
    };
    // The log guard is shared with the signal thread, which flushes it
    // itself when a stop signal ends a start-up that is still running.
    let log_guard = LogFlush(std::sync::Arc::new(std::sync::Mutex::new(Some(log_guard))));
    let phase = std::sync::Arc::new(std::sync::Mutex::new(Phase::Starting { reload: false }));
    let (sig_tx, sig_rx) = crossbeam_channel::unbounded();
    spawn_signal_thread(signals, phase.clone(), log_guard.0.clone(), sig_tx);
    let running = match mcp_broker::server::start(config, source) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mcp-broker: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    {
        // From here a stop signal drains; a SIGHUP that came during the
        // start reloads now, for the file may have changed since it was read.
        let mut phase = phase.lock().unwrap_or_else(|p| p.into_inner());
        if let Phase::Starting { reload: true } = *phase {
            tracing::info!("SIGHUP during start-up: reloading now");
            running.shared.request_reload(None);
        }
        *phase = Phase::Serving(running.shared.clone());
    }
    {
        // From a thread of its own: on a stdout pipe that is full and never
        // read the write blocks, and the main thread held there heard
        // neither stop signals nor a shard's death.
        let line = running.ready_line();
        // Also in the log: a deployment that keeps stderr only (2>file,
        // the journal) saw nothing of a start that went well.
        tracing::info!(version = env!("CARGO_PKG_VERSION"), "{line}");
        let write = move || {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        };
        if let Err(e) = std::thread::Builder::new()
            .name("ready-line".into())
            .spawn(write)
        {
            tracing::warn!(error = %e, "cannot spawn the thread that prints the ready line");
        }
    }
    // Wait for a signal, or for a shard thread to die: then the process
    // cannot serve every connection it accepts, so it drains the rest and
    // exits non-zero for its supervisor to restart it.
    let deaths = running.shared.deaths().clone();
    let died = crossbeam_channel::select! {
        recv(sig_rx) -> sig => {
            if let Ok(sig) = sig {
                tracing::info!(signal = sig, "shutting down");
            }
            false
        }
        recv(deaths) -> shard => {
            tracing::error!(shard = shard.ok(), "a shard thread died; draining the others and exiting with status {EXIT_SHARD_DIED}");
            true
        }
    };
    let shared = running.shared.clone();
    let grace = shared.config.broker.drain_grace;
    if !died && !grace.is_zero() {
        // Not ready, still serving: load balancers stop sending new work
        // before the drain refuses it.
        running.start_leaving();
        tracing::info!(?grace, "reporting not-ready before draining");
        crossbeam_channel::select! {
            recv(sig_rx) -> _ => tracing::info!("second signal: draining now"),
            recv(deaths) -> _ => tracing::error!("a shard thread died during the drain grace"),
            default(grace) => {}
        }
    }
    // A `POST /admin/reload` still waiting is answered 503 once it sees the
    // drain (within 50 ms); give it that, and its write, before the exit
    // cuts it off with no reply. (Looked at before the drain too: it may be
    // answered while the shards drain, its write still to come.)
    let waiting = || {
        shared
            .reloads_waiting
            .load(std::sync::atomic::Ordering::Acquire)
            > 0
    };
    let reload_pending = waiting();
    // From here a further stop signal exits at once (`Phase::Draining`).
    *phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Draining;
    running.drain();
    if reload_pending || waiting() {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while waiting() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // The count falls as the answer is made; its write follows at once.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if died || shared.any_shard_dead() {
        return ExitCode::from(EXIT_SHARD_DIED);
    }
    ExitCode::SUCCESS
}

type SharedLogGuard =
    std::sync::Arc<std::sync::Mutex<Option<tracing_appender::non_blocking::WorkerGuard>>>;

/// Writes the queued log lines when `main` returns, however it returns: the
/// signal thread holds the guard too, and never ends.
struct LogFlush(SharedLogGuard);

impl Drop for LogFlush {
    fn drop(&mut self) {
        drop(self.0.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// Where the broker is in its life, as the signal thread sees it.
enum Phase {
    /// `server::start` is running: a stop signal ends the process at once
    /// (nothing is served yet, so there is nothing to drain), and a SIGHUP
    /// is remembered for when it is done.
    Starting {
        reload: bool,
    },
    Serving(std::sync::Arc<mcp_broker::shared::Shared>),
    /// The drain runs (up to `broker.drain_timeout` and its second): a
    /// stop signal now ends the process at once, for an operator who will
    /// not wait for the calls still running (the second Ctrl-C).
    Draining,
}

/// The thread that turns signals into actions: SIGHUP reloads the config
/// file, SIGTERM and SIGINT go to `stops` once the broker serves.
fn spawn_signal_thread(
    mut signals: signal_hook::iterator::Signals,
    phase: std::sync::Arc<std::sync::Mutex<Phase>>,
    log_guard: SharedLogGuard,
    stops: crossbeam_channel::Sender<i32>,
) {
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let mut now = phase.lock().unwrap_or_else(|p| p.into_inner());
                match &mut *now {
                    Phase::Starting { reload } if sig == signal_hook::consts::SIGHUP => {
                        *reload = true;
                    }
                    Phase::Starting { .. } => {
                        // A slow start (upstreams that do not answer,
                        // large components) must not outlive a stop
                        // request: nothing is accepted yet, so leaving now
                        // loses nothing. The lock stays held, so the main
                        // thread cannot begin serving meanwhile.
                        tracing::info!(
                            signal = sig,
                            "signal during start-up: exiting without serving"
                        );
                        drop(log_guard.lock().unwrap_or_else(|p| p.into_inner()).take());
                        std::process::exit(0);
                    }
                    Phase::Serving(shared) if sig == signal_hook::consts::SIGHUP => {
                        // The routing thread logs the outcome.
                        if !shared.request_reload(None) {
                            tracing::warn!("SIGHUP ignored: too many reloads already queued");
                        }
                    }
                    Phase::Serving(_) => {
                        if stops.send(sig).is_err() {
                            break;
                        }
                    }
                    Phase::Draining if sig == signal_hook::consts::SIGHUP => {
                        tracing::info!("SIGHUP ignored: the broker is draining");
                    }
                    Phase::Draining => {
                        tracing::warn!(
                            signal = sig,
                            "stop signal during the drain: exiting now; calls still running \
                             get no answer"
                        );
                        drop(log_guard.lock().unwrap_or_else(|p| p.into_inner()).take());
                        // 128 + the signal, as a shell reports a process the
                        // signal ended: not the clean drain's 0.
                        std::process::exit(128 + sig);
                    }
                }
            }
        });
}

/// Exit status when a shard thread died (EX_SOFTWARE, sysexits.h).
const EXIT_SHARD_DIED: u8 = 70;

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn the_compilers_lines_stay_quiet_unless_named_and_a_bad_filter_is_said() {
        let (f, bad) = log_filter(Some("debug".into()));
        assert!(bad.is_none());
        let f = f.to_string();
        assert!(
            f.contains("cranelift_codegen=info") && f.contains("debug"),
            "{f}"
        );
        let (f, _) = log_filter(Some("trace,cranelift_codegen=trace".into()));
        let f = f.to_string();
        assert!(
            f.contains("cranelift_codegen=trace")
                && !f.contains("cranelift_codegen=info")
                && f.contains("cranelift_frontend=info"),
            "{f}"
        );
        let (f, bad) = log_filter(Some("mcp_broker=debug,h2=verbose".into()));
        assert!(bad.is_some_and(|e| !e.is_empty()));
        assert_eq!(f.to_string(), "info");
        let (f, bad) = log_filter(None);
        assert!(bad.is_none() && f.to_string() == "info");
    }
}
