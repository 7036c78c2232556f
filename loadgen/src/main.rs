//! `mcp-loadgen`: drives an MCP broker's frame edge or its gRPC edge, or
//! any MCP server over Streamable HTTP, with closed- or open-loop load and reports latency percentiles that can be
//! trusted. See `docs/loadgen.md`.
//!
//! Threads: the main thread parses, starts the engine, prints progress and
//! writes the reports; worker threads (one monoio runtime each for frames
//! and HTTP, one current-thread tokio runtime each for gRPC) own all connections and
//! measurements and only send the main thread one interval report per
//! second.
//!
//! Exit status: 0 when the run completed (response errors are reported,
//! not fatal), 1 when it could not run or stopped early (bad arguments,
//! refused or lost connection), 130 when interrupted (Ctrl-C); the JSON
//! report (and the interval log) is written in every case.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod alarm;
mod cli;
mod duration;
mod engine;
mod frames;
mod grpc;
mod http;
mod interrupt;
mod notify;
mod progress;
mod report;
mod rng;
mod rt;
mod schedule;
mod stats;
mod target;
mod tls;
mod workload;

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;

use crate::engine::{Outcome, Shared};
use crate::report::Report;
use crate::target::Scheme;

fn main() -> ExitCode {
    let args = match cli::Args::try_parse() {
        Ok(args) => args,
        Err(e) => return bad_command_line(&e),
    };
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mcp-loadgen: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &cli::Args) -> anyhow::Result<ExitCode> {
    let cfg = match args.validate() {
        Ok(cfg) => cfg,
        Err(e) => return fail_before_start(args, e),
    };
    // Both output files are created before anything connects: a path that
    // cannot be written must not cost a whole run to find out.
    if let Some(path) = &args.json
        && let Err(e) = File::create(path)
    {
        return fail_before_start(
            args,
            anyhow::anyhow!("cannot write the JSON report to {}: {e}", path.display()),
        );
    }
    let hlog = match args.hlog.as_deref().map(File::create).transpose() {
        Ok(f) => f,
        Err(e) => {
            let path = args.hlog.as_deref().unwrap_or(Path::new("")).display();
            return fail_before_start(
                args,
                anyhow::anyhow!("cannot create the interval log {path}: {e}"),
            );
        }
    };
    // The gRPC metadata for --bearer-file, parsed once for the run.
    let grpc_bearer = match cfg.target.scheme {
        Scheme::Grpc => match grpc::Bearer::new(cfg.bearer.as_deref()) {
            Ok(b) => b,
            Err(e) => return fail_before_start(args, anyhow::anyhow!(e)),
        },
        _ => grpc::Bearer::default(),
    };
    // From here on Ctrl-C stops the run and still reports it.
    if let Err(e) = interrupt::install() {
        eprintln!("mcp-loadgen: warning: cannot handle Ctrl-C ({e}); it will kill the run");
    }
    let cfg = Arc::new(cfg);
    let shared = Arc::new(Shared::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let engine = {
        let (cfg, shared) = (Arc::clone(&cfg), Arc::clone(&shared));
        let max_message = cfg.max_frame as usize;
        let connector = tls::Connector {
            tls: cfg.tls.clone(),
        };
        std::thread::Builder::new()
            .name("loadgen-engine".into())
            .spawn(move || match cfg.target.scheme {
                Scheme::Frames => {
                    let driver = frames::FramesDriver {
                        connector,
                        bearer: cfg.bearer.as_deref().map(Arc::from),
                        max_frame: cfg.max_frame,
                    };
                    engine::run(cfg, driver, tx, shared)
                }
                Scheme::Grpc => {
                    let driver = grpc::GrpcDriver {
                        max_message,
                        tls: cfg.tls.clone(),
                        bearer: grpc_bearer,
                    };
                    engine::run(cfg, driver, tx, shared)
                }
                Scheme::Http => {
                    let driver = http::HttpDriver {
                        authority: cfg.target.authority.clone(),
                        path: cfg.target.path.clone(),
                        max_body: max_message,
                        timeout: cfg.timeout,
                        extra_headers: cfg
                            .bearer
                            .as_ref()
                            .map(|t| format!("Authorization: Bearer {t}\r\n"))
                            .unwrap_or_default(),
                        connector,
                        modern: cfg.mcp_version == http::MODERN_VERSION,
                    };
                    engine::run(cfg, driver, tx, shared)
                }
            })
            .context("cannot start the engine thread")?
    };
    let mut progress = progress::Progress::new(cfg.threads, cfg.warmup, args.quiet);
    let hlog_result = progress.consume(rx, hlog, &shared);
    progress.finish();
    let outcome = engine.join().unwrap_or_else(|_| Outcome {
        stats: Default::default(),
        failure: Some("the engine thread panicked".into()),
        started: None,
        io_uring: false,
    });
    let mut report = Report::new(Some(&cfg), &cfg.target.to_string(), &outcome);
    // The run went on without its interval log; the exit status and the
    // JSON say that it failed, and why.
    let hlog_failed = match hlog_result {
        Err(e) if report.failure.is_none() => {
            report.failure = Some(format!("cannot write the interval log: {e:#}"));
            true
        }
        Err(e) => {
            eprintln!("mcp-loadgen: error: cannot write the interval log: {e:#}");
            true
        }
        Ok(()) => false,
    };
    print!("{}", report.human());
    let _ = std::io::stdout().flush();
    for w in report.warnings() {
        eprintln!("{w}");
    }
    write_json(args.json.as_deref(), &report)?;
    if shared.interrupted() {
        eprintln!("mcp-loadgen: interrupted; results above are partial");
        return Ok(ExitCode::from(interrupt::EXIT_CODE));
    }
    if let Some(f) = &report.failure {
        if hlog_failed || report.started_unix_ms.is_none() {
            eprintln!("mcp-loadgen: error: {f}");
        } else {
            eprintln!("mcp-loadgen: error: {f}; results above are partial");
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The run could not start: still leave a JSON report saying why.
fn fail_before_start(args: &cli::Args, e: anyhow::Error) -> anyhow::Result<ExitCode> {
    let outcome = Outcome {
        stats: Default::default(),
        failure: Some(format!("{e:#}")),
        started: None,
        io_uring: false,
    };
    let report = Report::new(None, &args.target, &outcome);
    if let Err(je) = write_json(args.json.as_deref(), &report) {
        eprintln!("mcp-loadgen: error: {je:#}");
    }
    Err(e)
}

/// clap refused the command line. `--help` and `--version` print and exit
/// 0; anything else is a bad argument like those `validate` finds: clap's
/// message, exit status 1, and the JSON report saying why, at the `--json`
/// path if the raw arguments name one.
fn bad_command_line(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let _ = e.print();
    let raw: Vec<OsString> = std::env::args_os().skip(1).collect();
    if let Some(json) = raw_value(&raw, "--json") {
        let message = e.render().to_string();
        let first = message.lines().next().unwrap_or_default();
        let outcome = Outcome {
            stats: Default::default(),
            failure: Some(first.strip_prefix("error: ").unwrap_or(first).to_owned()),
            started: None,
            io_uring: false,
        };
        let target = raw_value(&raw, "--target").unwrap_or_default();
        let report = Report::new(None, &target.to_string_lossy(), &outcome);
        if let Err(je) = write_json(Some(&PathBuf::from(json)), &report) {
            eprintln!("mcp-loadgen: error: {je:#}");
        }
    }
    ExitCode::FAILURE
}

/// The value of `--flag VALUE` or `--flag=VALUE` in arguments clap could
/// not parse (the last one, as clap takes it).
fn raw_value(raw: &[OsString], flag: &str) -> Option<OsString> {
    let mut found = None;
    let mut it = raw.iter();
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == flag {
            found = it.next().cloned();
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(OsString::from(v));
        }
    }
    found
}

fn write_json(path: Option<&Path>, report: &Report) -> anyhow::Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text + "\n")
        .with_context(|| format!("cannot write the JSON report to {}", path.display()))
}
