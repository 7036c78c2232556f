//! What the broker takes from its environment at start-up, against the real
//! binary: the routers of the embedded default, the CPUs it was given (its
//! affinity mask) and the descriptor limit.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Broker, error_code, tool_text};

/// The CPUs this test process may run on, ascending.
fn our_cpus() -> Vec<usize> {
    let mut v: Vec<usize> = core_affinity::get_core_ids()
        .expect("the test's affinity mask")
        .into_iter()
        .map(|c| c.id)
        .collect();
    v.sort_unstable();
    v
}

/// Makes `cmd`'s process start on `cpu` alone, as `taskset -c CPU` does.
fn taskset(cmd: &mut Command, cpu: usize) {
    // SAFETY: runs in the forked child before exec; it only builds a
    // cpu_set_t on the stack and calls sched_setaffinity, which is
    // async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes `cmd`'s process start with `resource` (RLIMIT_NOFILE, …) at
/// `soft:hard`, as `prlimit --nofile=SOFT:HARD` does.
fn limit(cmd: &mut Command, resource: libc::__rlimit_resource_t, soft: u64, hard: u64) {
    // SAFETY: runs in the forked child before exec; setrlimit is
    // async-signal-safe and reads only the struct on the stack.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(resource, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn our_hard_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `r`.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r.rlim_max
}

/// A `/proc/PID/limits` row's soft and hard values.
fn limits_row(pid: u32, row: &str) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(row))
        .unwrap_or_else(|| panic!("no {row:?} in {text}"));
    let mut f = line[row.len()..].split_whitespace();
    (f.next().unwrap().into(), f.next().unwrap().into())
}

/// `Cpus_allowed_list` of the broker's thread named `name`.
fn thread_cpus(pid: u32, name: &str) -> String {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let status = std::fs::read_to_string(dir.join("status")).unwrap();
            return status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .expect("Cpus_allowed_list")
                .trim()
                .to_string();
        }
    }
    panic!("no thread named {name} in broker {pid}");
}

fn temp_file(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "mcp-broker-startup-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ))
}

#[test]
fn embedded_default_does_not_serve_the_chaos_router() {
    let b = Broker::start_default(&["--shards", "1"]);
    assert_eq!(b.routers, ["echo", "kv", "library"], "{}", b.ready_line);
    let mut c = b.connect();
    let r = c.call("trap", &[], None);
    assert_eq!(
        error_code(&r),
        Some(mcp_schema::ErrorCode::NotFound.code()),
        "chaos's `trap` is no tool of the default"
    );
}

#[test]
fn shard_is_pinned_within_the_inherited_cpu_mask() {
    // `taskset -c LAST`: on a 2-CPU machine, CPU 1, which is not shard 0's
    // index.
    let cpu = *our_cpus().last().unwrap();
    let b = Broker::start_command(None, &[], |cmd| taskset(cmd, cpu));
    assert_eq!(
        b.shards, 1,
        "one shard per CPU of the mask: {}",
        b.ready_line
    );
    assert_eq!(thread_cpus(b.child.id(), "shard-0"), cpu.to_string());
}

#[test]
fn explicit_cpus_outside_the_mask_fail_start_up_naming_them() {
    let cpus = our_cpus();
    let given = *cpus.last().unwrap();
    // A CPU the broker will not have: another of ours, else one past it.
    let other = cpus
        .iter()
        .copied()
        .find(|&c| c != given)
        .unwrap_or(given + 1);
    let config = temp_file("cpus.toml");
    std::fs::write(
        &config,
        format!(
            "[broker]\nshards = 1\ncpus = [{other}]\n\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-broker"));
    cmd.args([
        "--config",
        config.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    taskset(&mut cmd, given);
    let mut child = cmd.spawn().unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(60));
    let _ = std::fs::remove_file(&config);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "started on a CPU outside its mask");
    assert!(out.stdout.is_empty(), "no ready line expected");
    assert!(
        stderr.contains(&format!("broker.cpus: CPU {other} is outside"))
            && stderr.contains(&format!("allowed: {given}")),
        "{stderr}"
    );
}

/// Start-up names every router whose component cannot be loaded, as a
/// reload of the same file does, and the hint to build the bundled routers
/// only where it applies; the log is plain text off a terminal.
#[test]
fn every_router_that_cannot_load_is_named_at_start_up() {
    let junk = temp_file("junk.wasm");
    std::fs::write(&junk, b"\0asm not a component").unwrap();
    let ghost = temp_file("ghost.wasm");
    let config = temp_file("bad-routers.toml");
    std::fs::write(
        &config,
        format!(
            "[[routers]]\nname = \"ghost\"\nwasm = \"{}\"\n\
             [[routers]]\nname = \"junk\"\nwasm = \"{}\"\n\
             [[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n",
            ghost.display(),
            junk.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-broker"))
        .args(["--config", config.to_str().unwrap(), "--shards", "1"])
        .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
        .args([
            "--http-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&junk);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty(), "no ready line expected");
    assert!(
        stderr.contains("router `ghost`: cannot read") && stderr.contains("router `junk`"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("build-routers"),
        "the hint is for the bundled routers' files: {stderr}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "colour codes in a log file: {stderr}"
    );
}

/// Pool sizes that pass validation key by key can sum to more address
/// space than a process has: start-up fails naming the keys that make the
/// sum, where it showed only wasmtime's mmap error.
#[test]
fn instance_pools_larger_than_the_address_space_fail_naming_their_keys() {
    let stderr = common::fails_to_start(
        "[broker]\nshards = 1\n\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n\
         instances_per_shard = 100000\n",
    );
    assert!(
        stderr.contains("instance slots") && stderr.contains("instances_per_shard"),
        "{stderr}"
    );
}

#[test]
fn soft_descriptor_limit_is_raised_to_the_hard_limit() {
    let hard = our_hard_nofile().min(1 << 20);
    let b = Broker::start_command(None, &["--shards", "1"], |cmd| {
        limit(cmd, libc::RLIMIT_NOFILE, 256, hard)
    });
    let (soft_now, hard_now) = limits_row(b.child.id(), "Max open files");
    assert_eq!(hard_now, hard.to_string());
    assert_eq!(soft_now, hard.to_string(), "soft limit raised from 256");
}

#[test]
fn descriptor_limit_below_the_configured_connections_is_warned() {
    // One shard's bounds (4096 frame and 10,000 HTTP connections, 10,000
    // gRPC ones) need more than a hard limit of 2048.
    let log = temp_file("stderr.log");
    let file = std::fs::File::create(&log).unwrap();
    let b = Broker::start_command(None, &["--shards", "1"], |cmd| {
        limit(cmd, libc::RLIMIT_NOFILE, 256, 2048);
        cmd.stderr(file);
    });
    // The warning comes before the ready line, which the harness waited for.
    let text = std::fs::read_to_string(&log).unwrap();
    drop(b);
    let _ = std::fs::remove_file(&log);
    let need = mcp_broker::process::descriptors_needed(1, 4096 + 10_000, 10_000);
    let line = text
        .lines()
        .find(|l| l.contains("WARN") && l.contains("open-file limit"))
        .unwrap_or_else(|| panic!("no descriptor warning in:\n{text}"));
    assert!(
        line.contains("(2048)") && line.contains(&need.to_string()),
        "{line}"
    );
}

/// A stdout nobody reads, already full when the broker starts (a
/// supervisor's pipe that is never drained): the ready line cannot be
/// written, and the broker still serves, and stops on SIGTERM. The main
/// thread wrote the line itself and, blocked there, never heard the signal.
#[test]
fn a_full_stdout_pipe_neither_blocks_serving_nor_the_stop() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into `fds`, owned below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are fresh descriptors no one else owns.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Fill it without blocking, then hand it over blocking, as it would be.
    // SAFETY: fcntl and write on the pipe's own descriptor.
    unsafe {
        libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK);
        let chunk = [b'x'; 4096];
        while libc::write(fds[1], chunk.as_ptr().cast(), chunk.len()) > 0 {}
        libc::fcntl(fds[1], libc::F_SETFL, 0);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-broker"))
        // Every listener on port 0 but the admin endpoint's, polled below.
        .args(&common::PORT_ZERO[..6])
        .args(["--shards", "1", "--metrics-listen", &metrics])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .spawn()
        .unwrap();
    let healthy = || {
        let Ok(mut s) = std::net::TcpStream::connect(&metrics) else {
            return false;
        };
        use std::io::{Read, Write};
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.starts_with("HTTP/1.1 200")
    };
    assert!(
        common::http::eventually(Duration::from_secs(60), healthy),
        "the broker never became ready"
    );
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    drop(read_end);
}

/// Too few descriptors to start fails with the reason. Just enough to
/// open everything printed the ready line with no descriptor left to
/// serve, and with a few less the admin endpoint's runtime failed in its
/// own thread: a ready broker whose `/readyz` never answered.
/// With RLIMIT_NPROC below the threads it runs, the broker refused to
/// start only from inside a thread pool, with a panic (rayon's "The global
/// thread pool has not been initialized", tokio's "OS can't spawn worker
/// thread"). Root is exempt from the limit, so as root the broker runs as
/// `nobody`, from a copy any user may run.
#[test]
fn a_thread_limit_below_what_the_broker_runs_fails_start_up_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("mcp-broker");
    std::fs::copy(env!("CARGO_BIN_EXE_mcp-broker"), &bin).unwrap();
    for p in [dir.path(), &bin] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // SAFETY: getuid cannot fail.
    let root = unsafe { libc::getuid() } == 0;
    let start = |tasks: u64| {
        let mut cmd = Command::new(&bin);
        cmd.args(common::PORT_ZERO)
            .args(["--shards", "2"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if root {
            cmd.uid(65534).gid(65534);
        }
        limit(&mut cmd, libc::RLIMIT_NPROC, tasks, tasks);
        cmd.spawn().unwrap()
    };
    let refused = |limit: u64| {
        let mut child = start(limit);
        let status = wait_exit(&mut child, Duration::from_secs(60));
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(status.code(), Some(1), "limit {limit}: {stderr}");
        assert!(out.stdout.is_empty(), "limit {limit}: a ready line");
        assert!(
            stderr.contains("RLIMIT_NPROC") && stderr.contains(&format!("allows {limit} tasks")),
            "limit {limit}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "limit {limit}: {stderr}");
    };
    refused(8);
    if !root {
        // The user's other tasks (this test's among them) count too: the
        // limit's edge can be found only for a user with none.
        return;
    }
    // The edge, as docs/deploy.md counts it: 10 + shards + the compiler's
    // threads (one per CPU this process may use). One short was let
    // through and served without ever writing its ready line.
    let compilers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let needed = 10 + 2 + compilers;
    refused(needed - 1);
    let mut child = start(needed);
    let mut line = String::new();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        line
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reader.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = reader.join().unwrap();
    assert!(
        line.starts_with("mcp-broker ready"),
        "limit {needed}: {line:?}"
    );
}

#[test]
fn too_few_descriptors_fail_start_up_with_the_reason() {
    // 20: the admin endpoint cannot start; 32: it starts, with fewer than
    // 32 left whatever the machine opened.
    for fds in [20, 32] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-broker"));
        cmd.args(common::PORT_ZERO)
            .args(["--shards", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        limit(&mut cmd, libc::RLIMIT_NOFILE, fds, fds);
        let mut child = cmd.spawn().unwrap();
        let status = wait_exit(&mut child, Duration::from_secs(60));
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(status.code(), Some(1), "limit {fds}: {stderr}");
        assert!(out.stdout.is_empty(), "limit {fds}: a ready line");
        assert!(
            stderr.contains("Too many open files") || stderr.contains("file descriptors are left"),
            "limit {fds}: {stderr}"
        );
    }
}

#[test]
fn accepts_out_of_descriptors_are_counted_and_paced_and_serving_resumes() {
    // A hard limit the broker starts under, then more frame connections
    // than it has descriptors left: each accept fails with EMFILE (the
    // connection stays in the backlog) until the client side lets go.
    const LIMIT: u64 = 160;
    let log = temp_file("emfile.log");
    let file = std::fs::File::create(&log).unwrap();
    let b = Broker::start_command(None, &["--shards", "1"], |cmd| {
        limit(cmd, libc::RLIMIT_NOFILE, LIMIT, LIMIT);
        cmd.stderr(file);
    });
    let open_fds =
        || std::fs::read_dir(format!("/proc/{}/fd", b.child.id())).map_or(0, |d| d.count() as u64);
    let free = LIMIT.saturating_sub(open_fds());
    assert!(free > 8, "the broker left too few descriptors to test with");
    let began = Instant::now();
    let held: Vec<std::net::TcpStream> = (0..free + 16)
        .map(|_| std::net::TcpStream::connect(b.frames).unwrap())
        .collect();
    assert!(
        common::http::eventually(Duration::from_secs(10), || open_fds() >= LIMIT),
        "the broker never ran out of descriptors ({} open)",
        open_fds()
    );
    // Two seconds of failing accepts: about 200 at one per 10 ms.
    std::thread::sleep(Duration::from_secs(2));
    drop(held);
    // Out of descriptors, /metrics could not be served either; now it can.
    assert!(common::http::eventually(Duration::from_secs(10), || {
        b.metric_sum("mcp_accept_errors_total") >= 50.0
    }));
    let failing = began.elapsed();
    // Serving again, on the edge that ran out.
    let mut c = b.connect();
    let r = c.call("echo", &[("text", "\"back\"")], None);
    assert_eq!(tool_text(&r), r#"{"text":"back"}"#);
    drop(b);
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("accept failed"))
        .collect();
    assert!(!lines.is_empty(), "no accept failure logged:\n{text}");
    assert!(
        lines[0].contains("out of file descriptors") && lines[0].contains("edge=\"frames\""),
        "{}",
        lines[0]
    );
    // The log's budget: 20 at once, then 10 a second (one per failure, 100
    // a second, before).
    let allowed = 20 + (failing.as_secs_f64() * 10.0).ceil() as usize + 1;
    assert!(
        lines.len() <= allowed,
        "{} lines in {failing:?}",
        lines.len()
    );
}

#[test]
fn the_drain_grace_reports_not_ready_while_still_serving_and_a_second_signal_ends_it() {
    let toml =
        mcp_broker::config::DEFAULT_TOML.replace("drain_grace = \"0s\"", "drain_grace = \"20s\"");
    assert!(toml.contains("drain_grace = \"20s\""));
    let mut b = Broker::start_with_config(&toml, &[]);
    assert_eq!(b.http_get("/readyz").0, 200);
    b.sigterm();
    // Not ready at once (a load balancer stops sending new work)...
    assert!(common::http::eventually(Duration::from_secs(5), || {
        b.http_get("/readyz").0 == 503
    }));
    let (_, body) = b.http_get("/readyz");
    assert!(body.contains("still serving"), "{body}");
    // Leaving, not failing: McpBrokerNotReady (not ready and not
    // draining) stays quiet through a grace longer than its 2 minutes.
    assert_eq!(
        (b.metric_sum("mcp_ready"), b.metric_sum("mcp_draining")),
        (0.0, 1.0)
    );
    // ...while everything is still served, new connections and sessions too.
    let mut c = b.connect();
    assert_eq!(
        tool_text(&c.call("echo_text", &[("text", "\"still here\"")], None)),
        "still here"
    );
    let mut h = common::http::Conn::connect(b.http);
    let s = h.initialize("2025-06-18");
    let r = h.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"echo_text","arguments":{"text":"ok"}}"#,
    );
    assert_eq!(r["result"]["content"][0]["text"], "ok", "{r}");
    // A second signal drains now instead of after the 20 s grace.
    let t0 = std::time::Instant::now();
    let status = b.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
}

/// A stop signal during the drain was ignored: an operator's second
/// Ctrl-C waited for the calls still running, up to `drain_timeout`. It
/// ends the process at once, with the signal's status.
#[test]
fn a_stop_signal_during_the_drain_exits_at_once() {
    let cfg = "[broker]\nshards = 1\ndrain_timeout = \"60s\"\n\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\ncall_deadline = \"60s\"\n";
    let (mut b, log) = Broker::start_logged(cfg, &[]);
    let mut c = b.connect();
    let (_, f) = c.tool_call_frame("sleep", &[("ms", "50000")], None);
    c.send_raw(&f);
    // The call runs: the drain waits for it.
    assert!(common::http::eventually(Duration::from_secs(5), || {
        b.metric_sum("mcp_in_flight_requests") == 1.0
    }));
    b.sigterm();
    assert!(
        log.shows("draining", Duration::from_secs(5)),
        "{}",
        log.text()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        b.child.try_wait().unwrap().is_none(),
        "exited before the call ended"
    );
    let t0 = Instant::now();
    let status = b.terminate(Duration::from_secs(10));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(
        log.shows("stop signal during the drain", Duration::from_secs(1)),
        "{}",
        log.text()
    );
}

#[test]
fn after_the_drain_grace_the_broker_drains_and_exits_by_itself() {
    let toml =
        mcp_broker::config::DEFAULT_TOML.replace("drain_grace = \"0s\"", "drain_grace = \"1s\"");
    let mut b = Broker::start_with_config(&toml, &[]);
    let t0 = Instant::now();
    b.sigterm();
    let status = loop {
        if let Some(s) = b.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no exit after the grace"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "exited before its grace: {:?}",
        t0.elapsed()
    );
}

/// Once the drain begins, every shard's listeners stop listening: new
/// connections to every edge are refused at once, on a broker that still
/// finishes a call on one shard. Idle shards once left theirs listening
/// until the process exited (their ring's pending accept held the socket
/// open after the listener was dropped): with two shards about half of
/// the new connections were taken into a backlog nobody read, and hung
/// until the drain deadline, a second after it, or the exit.
#[test]
fn a_draining_broker_refuses_new_connections_on_every_shard_and_edge() {
    let mut b = Broker::start(&["--shards", "2"]);
    let frames = b.frames;
    let call = std::thread::spawn(move || {
        let mut c = common::Client::connect(frames);
        tool_text(&c.call("sleep", &[("ms", "1500")], None))
    });
    std::thread::sleep(Duration::from_millis(300));
    b.sigterm();
    std::thread::sleep(Duration::from_millis(300));
    for (edge, addr) in [("frames", b.frames), ("grpc", b.grpc), ("http", b.http)] {
        let taken: Vec<_> = (0..16)
            .filter_map(|_| {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                    .ok()
                    .map(|s| s.local_addr().unwrap())
            })
            .collect();
        assert!(
            taken.is_empty(),
            "{edge}: {} of 16 new connections were taken by a draining broker (from {taken:?})",
            taken.len()
        );
    }
    let status = b.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    let text = call.join().unwrap();
    assert!(
        text.contains("slept"),
        "the call in flight finishes: {text}"
    );
}

/// Log lines never stop the broker: a stderr reader that stops reading (a
/// stalled log shipper) does not block the shards that log, and one that is
/// gone (EPIPE) does not kill the broker, which still drains and exits 0.
#[test]
fn a_stalled_or_gone_stderr_reader_neither_blocks_nor_kills_the_broker() {
    use std::io::Write;
    let mut b = Broker::start_command(None, &["--shards", "1"], |c| {
        c.stderr(Stdio::piped());
    });
    let stderr = b.child.stderr.take().unwrap();
    // Each refused frame connection logs a line; 1,500 of them are far
    // more than a pipe holds (64 KiB), and nothing reads it.
    let flood = |n: usize| {
        for _ in 0..n {
            let mut s = std::net::TcpStream::connect(b.frames).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.write_all(&u32::MAX.to_le_bytes());
            let mut sink = Vec::new();
            // Closed at once; a shard blocked writing its log line never
            // gets to it.
            if let Err(e) = std::io::Read::read_to_end(&mut s, &mut sink) {
                assert!(
                    !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ),
                    "a refused connection was not closed within 5 s: the shard is stuck logging"
                );
            }
        }
    };
    let call = |b: &Broker| {
        let mut c = common::http::Conn::connect(b.http);
        let s = c.initialize("2025-11-25");
        let v = c.call(
            &s,
            1,
            "tools/call",
            r#"{"name":"echo","arguments":{"x":1}}"#,
        );
        assert!(v["result"].is_object(), "{v}");
    };
    flood(1500);
    let t0 = Instant::now();
    call(&b);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The reader goes: every write to stderr now fails.
    drop(stderr);
    flood(50);
    call(&b);
    // The lines the budget let through fit the writer's queue: none was
    // dropped, and /metrics says so.
    let (_, metrics) = b.http_get("/metrics");
    assert!(
        metrics.contains("\nmcp_log_lines_dropped_total 0\n"),
        "{metrics}"
    );
    let status = b.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
}

/// A router granted stdio writes through the log thread too: its output
/// once was a write(2) on the shard thread, so a stderr nobody read froze
/// the shard (every later call timed out, and a stop signal was never
/// acted on). And its text is escaped: a guest echoing a client's text
/// cannot forge log lines.
#[test]
fn a_router_granted_stdio_neither_blocks_on_nor_forges_the_log() {
    let toml = r#"
[broker]
shards = 1
[[routers]]
name = "echo"
wasm = "echo.wasm"
[[routers]]
name = "chaos"
wasm = "chaos.wasm"
[routers.grants]
stdio = true
"#;
    let call = |b: &Broker, tool: &str, args: &str| {
        let mut c = common::http::Conn::connect(b.http);
        let s = c.initialize("2025-11-25");
        let t0 = Instant::now();
        let v = c.call(
            &s,
            1,
            "tools/call",
            &format!(r#"{{"name":"{tool}","arguments":{args}}}"#),
        );
        assert!(v["result"].is_object(), "{v}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{tool}: {:?}",
            t0.elapsed()
        );
    };
    // Nothing reads this stderr: 3 x 2 x 70 KB is far more than the pipe
    // holds (64 KiB).
    let mut b = Broker::start_command(Some(toml), &[], |c| {
        c.stderr(Stdio::piped());
    });
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(70_000));
    for _ in 0..3 {
        call(&b, "print", &big);
    }
    call(&b, "echo", r#"{"x":1}"#);
    let status = b.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");

    let (b, log) = Broker::start_logged(toml, &[]);
    call(
        &b,
        "print",
        r#"{"text":"hi\n2026-12-07T00:00:00.000000Z ERROR mcp_broker: forged\u001b[2J"}"#,
    );
    common::http::eventually(Duration::from_secs(5), || {
        log.text().matches("router_output").count() >= 4
    });
    let text = log.text();
    assert!(
        !text.contains("\n2026-12-07T00:00:00.000000Z ERROR") && !text.contains('\u{1b}'),
        "{text:?}"
    );
    assert!(
        text.contains(r#"router=chaos stream="stdout" text="2026-12-07T00:00:00.000000Z ERROR mcp_broker: forged\u{1b}[2J""#),
        "{text}"
    );
}

/// A router's fault (a trap here) names the router and why in the log,
/// within a budget: it was only counted, and a router trapping on every
/// call must not flood the log either.
#[test]
fn router_faults_are_logged_within_a_budget() {
    let toml = "[broker]\nshards = 1\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\n";
    let (b, log) = Broker::start_logged(toml, &[]);
    let mut c = common::http::Conn::connect(b.http);
    let s = c.initialize("2025-11-25");
    for i in 0..40 {
        let v = c.call(&s, i, "tools/call", r#"{"name":"trap","arguments":{}}"#);
        assert!(
            v["error"].is_object() || v["result"]["isError"] == true,
            "{v}"
        );
    }
    log.shows("router fault", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(200));
    let text = log.text();
    let faults: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("router fault"))
        .collect();
    assert!(
        faults[0].contains("router=chaos") && faults[0].contains("replaced=true"),
        "{text}"
    );
    // The shard's budget: a burst of 20, then 10 a second.
    assert!((1..=30).contains(&faults.len()), "{}: {text}", faults.len());
    // The ready line is in the log too, with the version (a deployment
    // that keeps only stderr saw nothing of a good start).
    assert!(
        text.lines()
            .any(|l| l.contains("mcp-broker ready frames=") && l.contains("version=")),
        "{text}"
    );
}

/// `--log-format json`: every stderr line is one JSON object (for log
/// shippers), a router's printed text included, escaped by the encoder.
#[test]
fn json_logs_are_one_object_per_line() {
    let toml = "[broker]\nshards = 1\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\n[routers.grants]\nstdio = true\n";
    let (b, log) = Broker::start_logged(toml, &["--log-format", "json"]);
    let mut c = common::http::Conn::connect(b.http);
    let s = c.initialize("2025-11-25");
    let v = c.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"print","arguments":{"text":"a \"quoted\"\nline"}}"#,
    );
    assert!(v["result"].is_object(), "{v}");
    common::http::eventually(Duration::from_secs(5), || {
        log.text().matches("router_output").count() >= 4
    });
    let text = log.text();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "INFO"
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("mcp-broker ready"))),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["target"] == "mcp_broker::router_output"
                && l["fields"]["router"] == "chaos"
                && l["fields"]["text"] == r#""a \"quoted\"""#),
        "{text}"
    );
}

/// An upstream that accepts connections and never answers: the broker's
/// start-up waits up to the router's `call_deadline` for its listing.
fn silent_upstream() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    l.set_nonblocking(true).unwrap();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        let until = Instant::now() + Duration::from_secs(40);
        while Instant::now() < until {
            match l.accept() {
                Ok((s, _)) => conns.push(s),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    (addr, held)
}

/// The broker started against a silent upstream, its output piped; `None`
/// stdin so a test's signal is the only thing that ends it early.
fn slow_start(call_deadline: &str) -> std::process::Child {
    let (upstream, _held) = silent_upstream();
    let config = temp_file("slow-start.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[[routers]]\nname = \"silent\"\nupstream = \"http://{upstream}/mcp\"\ncall_deadline = \"{call_deadline}\"\n",
            mcp_broker::config::DEFAULT_TOML
        ),
    )
    .unwrap();
    Command::new(env!("CARGO_BIN_EXE_mcp-broker"))
        .arg("--config")
        .arg(&config)
        .args(common::PORT_ZERO)
        .args(["--shards", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `child`'s exit status, waited for at most `within`: past it the child
/// is killed and the test fails.
fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the broker did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A stop signal during a slow start-up (an upstream that does not answer)
/// ends the process at once with status 0 and no ready line, where it used
/// to be held until start-up was done, then served and drained.
#[test]
fn a_stop_signal_during_start_up_exits_at_once_without_serving() {
    let mut child = slow_start("30s");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited before the signal"
    );
    let t0 = Instant::now();
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut child, Duration::from_secs(10));
    let took = t0.elapsed();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        took < Duration::from_secs(3),
        "exit took {took:?}: {stderr}"
    );
    assert!(out.stdout.is_empty(), "a ready line after the stop signal");
    assert!(
        stderr.contains("signal during start-up: exiting without serving"),
        "{stderr}"
    );
}

/// A SIGHUP during start-up is not lost: once ready, the broker reloads,
/// for the file may have changed after it was read.
#[test]
fn a_sighup_during_start_up_reloads_once_ready() {
    let mut child = slow_start("2s");
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert!(line.starts_with("mcp-broker ready"), "{line:?}");
    // The reload runs on the routing thread.
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut child, Duration::from_secs(20));
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        stderr.contains("SIGHUP during start-up: reloading now"),
        "{stderr}"
    );
    assert!(stderr.contains("reload applied"), "{stderr}");
}
