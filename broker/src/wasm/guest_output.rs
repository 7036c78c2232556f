//! A router's stdout and stderr when granted (`[routers.grants] stdio`):
//! each line the guest writes becomes one log record of the broker's
//! (INFO, target `mcp_broker::router_output`, fields `router`, `stream`
//! and the line as `text`).
//!
//! Why not the broker's stderr itself, as it was: the guest's write was a
//! `write(2)` on the shard thread, so a stderr nobody read (a stalled log
//! shipper) froze the shard, stop signals included; the log thread's queue
//! drops instead (`mcp_log_lines_dropped_total`). And the text went out
//! raw, so a guest echoing a client's text could forge whole log lines;
//! `text` is written escaped (Rust's `Debug` of a string: quotes, `\n`,
//! `\r`, `\u{1b}`).
//!
//! # Invariants
//! - A write never blocks and never fails: what is over the rate is
//!   counted and said (`suppressed=N` on the next line let through), a
//!   line is cut at [`MAX_LINE`] bytes (at a character boundary).
//! - The rate is the router's ([`Rate`], shared by all its instances on
//!   every shard): an instance replaced after a fault must not start with
//!   a fresh allowance, or a client alternating prints and traps floods
//!   the log. The partial lines (one for stdout, one for stderr) are the
//!   store's, shared by every stream the guest opens (a Rust guest opens
//!   one per write): a line written in pieces is one record, and a stdout
//!   line is never completed by stderr's bytes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// A line longer than this is logged in pieces of this size.
pub const MAX_LINE: usize = 4096;
/// Lines a router may log at once, and per second after that: a guest
/// printing without end must not crowd the broker's own lines out of the
/// log queue.
const BURST: f64 = 100.0;
const PER_SECOND: f64 = 20.0;

/// One router's allowance of output lines, shared by its instances.
pub struct Rate {
    router: Arc<str>,
    tokens: f64,
    refilled: Instant,
    suppressed: u64,
}

impl Rate {
    pub fn new(router: &str) -> Arc<Mutex<Rate>> {
        Arc::new(Mutex::new(Rate {
            router: router.into(),
            tokens: BURST,
            refilled: Instant::now(),
            suppressed: 0,
        }))
    }
}

/// The streams' names, as the records' `stream` field gives them; a
/// [`GuestOutput`] holds its index here.
const STREAMS: [&str; 2] = ["stdout", "stderr"];

/// One of a store's two output streams.
#[derive(Clone)]
pub struct GuestOutput {
    stream: usize,
    state: Arc<Mutex<State>>,
}

struct State {
    rate: Arc<Mutex<Rate>>,
    /// Each stream's unfinished line, by its index in [`STREAMS`].
    partial: [Vec<u8>; 2],
}

impl GuestOutput {
    /// The stdout and stderr of one store of the router whose `rate` it is.
    pub fn pair(rate: &Arc<Mutex<Rate>>) -> (Self, Self) {
        let state = Arc::new(Mutex::new(State {
            rate: rate.clone(),
            partial: Default::default(),
        }));
        let out = Self {
            stream: 0,
            state: state.clone(),
        };
        (out, Self { stream: 1, state })
    }

    fn push(&self, bytes: &[u8]) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.stream;
        let mut rest = bytes;
        while !rest.is_empty() {
            let room = MAX_LINE - s.partial[n].len();
            match rest.iter().take(room).position(|&b| b == b'\n') {
                Some(at) => {
                    s.partial[n].extend_from_slice(&rest[..at]);
                    rest = &rest[at + 1..];
                    s.emit(n);
                }
                None => {
                    let take = rest.len().min(room);
                    s.partial[n].extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if s.partial[n].len() == MAX_LINE {
                        // Cut where a character ends: a character split
                        // in two would read as two replacement marks.
                        let keep = char_start(&s.partial[n]);
                        let tail = s.partial[n].split_off(keep);
                        s.emit(n);
                        s.partial[n] = tail;
                    }
                }
            }
        }
    }
}

/// Where the last character of a full line starts, if it may be cut
/// (else the line's length): the bytes from there go to the next piece.
fn char_start(line: &[u8]) -> usize {
    // A UTF-8 character is at most 4 bytes: look back at most 3.
    for back in 1..=3.min(line.len()) {
        let at = line.len() - back;
        let b = line[at];
        if b & 0xC0 != 0x80 {
            // A lead byte: complete if the sequence it starts fits.
            let len = match b {
                0x00..=0x7F => 1,
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            return if back < len { at } else { line.len() };
        }
    }
    line.len()
}

impl State {
    /// Logs stream `n`'s partial line (and empties it), if the rate allows.
    fn emit(&mut self, n: usize) {
        let stream = STREAMS[n];
        let line = std::mem::take(&mut self.partial[n]);
        let mut rate = self.rate.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let elapsed = now.duration_since(rate.refilled).as_secs_f64();
        rate.tokens = (rate.tokens + elapsed * PER_SECOND).min(BURST);
        rate.refilled = now;
        if rate.tokens < 1.0 {
            rate.suppressed += 1;
            return;
        }
        rate.tokens -= 1.0;
        let text = String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(&line));
        let suppressed = std::mem::take(&mut rate.suppressed);
        let router = &rate.router;
        if suppressed == 0 {
            tracing::info!(target: "mcp_broker::router_output", %router, stream, text = ?text);
        } else {
            tracing::info!(target: "mcp_broker::router_output", %router, stream, suppressed, text = ?text);
        }
    }
}

impl Drop for State {
    /// What the guest wrote without a final newline is its last line.
    fn drop(&mut self) {
        for n in 0..STREAMS.len() {
            if !self.partial[n].is_empty() {
                self.emit(n);
            }
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

// `Pollable` is an `async_trait`; this is the signature it expands to.
impl Pollable for GuestOutput {
    fn ready<'a, 'b>(&'a mut self) -> Pin<Box<dyn Future<Output = ()> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        // Always ready: a write is never refused.
        Box::pin(std::future::ready(()))
    }
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Sink(Arc<StdMutex<Vec<u8>>>);

    impl io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn logged(f: impl FnOnce()) -> String {
        let sink = Sink::default();
        let writer = sink.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(sub, f);
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn lines_are_records_with_their_text_escaped() {
        let log = logged(|| {
            let (mut out, mut err) = GuestOutput::pair(&Rate::new("chaos"));
            out.write(Bytes::from_static(b"first li")).unwrap();
            out.write(Bytes::from_static(
                b"ne\r\nforged\n2026-12-07T00:00:00Z ERROR x\x1b[2J\n",
            ))
            .unwrap();
            err.write(Bytes::from_static(b"no newline at the end"))
                .unwrap();
            // Interleaved pieces: each stream finishes its own line.
            out.write(Bytes::from_static(b"out ")).unwrap();
            err.write(Bytes::from_static(b" (err)")).unwrap();
            out.write(Bytes::from_static(b"done\n")).unwrap();
            out.write(Bytes::from_static(b"unended out")).unwrap();
        });
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 6, "{log}");
        assert!(
            lines[0].contains(r#"router=chaos stream="stdout" text="first line""#),
            "{log}"
        );
        assert!(lines[1].ends_with(r#"text="forged""#), "{log}");
        assert!(
            lines[2].ends_with(r#"text="2026-12-07T00:00:00Z ERROR x\u{1b}[2J""#),
            "{log}"
        );
        assert!(
            lines[3].contains(r#"stream="stdout" text="out done""#),
            "{log}"
        );
        // At the end, each stream's unfinished line under its own name.
        assert!(
            lines[4].contains(r#"stream="stdout" text="unended out""#),
            "{log}"
        );
        assert!(
            lines[5].contains(r#"stream="stderr" text="no newline at the end (err)""#),
            "{log}"
        );
        assert!(!log.contains('\u{1b}'), "{log:?}");
    }

    #[test]
    fn a_new_instance_shares_its_routers_allowance_and_cuts_at_characters() {
        let log = logged(|| {
            let rate = Rate::new("r");
            for _ in 0..3 {
                // An instance replaced after each burst starts with what
                // the router has left, not a fresh allowance.
                let (mut out, _) = GuestOutput::pair(&rate);
                for i in 0..80 {
                    out.write(Bytes::from(format!("line {i}\n"))).unwrap();
                }
            }
        });
        let n = log.lines().count();
        assert!((BURST as usize..BURST as usize + 3).contains(&n), "{n}");
        let log = logged(|| {
            let (mut out, _) = GuestOutput::pair(&Rate::new("r"));
            let mut line = "Y".repeat(MAX_LINE - 1).into_bytes();
            line.extend_from_slice("é\n".as_bytes());
            out.write(Bytes::from(line)).unwrap();
        });
        assert!(!log.contains('\u{fffd}'), "{log}");
        assert!(
            log.lines().nth(1).unwrap().ends_with(r#"text="é""#),
            "{log}"
        );
    }

    #[test]
    fn long_lines_are_cut_and_a_flood_is_rate_limited() {
        let log = logged(|| {
            let (mut out, _) = GuestOutput::pair(&Rate::new("r"));
            out.write(Bytes::from(vec![b'a'; MAX_LINE * 2 + 10]))
                .unwrap();
            out.write(Bytes::from_static(b"\n")).unwrap();
            for i in 0..1000 {
                out.write(Bytes::from(format!("line {i}\n"))).unwrap();
            }
        });
        let lines: Vec<&str> = log.lines().collect();
        // Three pieces of the long line, then the burst's rest (a token
        // or two more if the loop was slow).
        let n = lines.len();
        assert!((BURST as usize..BURST as usize + 3).contains(&n), "{n}");
        let a = "a".repeat(MAX_LINE);
        assert!(lines[0].contains(&format!("text=\"{a}\"")), "{}", lines[0]);
        assert!(lines[2].contains(&format!("text=\"{}\"", "a".repeat(10))));
        assert!(!log.contains("line 999"), "the flood was cut");
        assert!(
            !log.contains("suppressed"),
            "nothing let through after the flood"
        );
        // The next line let through says how many were not.
        let log = logged(|| {
            let (mut out, _) = GuestOutput::pair(&Rate::new("r"));
            for i in 0..150 {
                out.write(Bytes::from(format!("line {i}\n"))).unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(120));
            out.write(Bytes::from_static(b"after\n")).unwrap();
        });
        let last = log.lines().last().unwrap();
        assert!(
            last.contains("suppressed=") && last.ends_with(r#"text="after""#),
            "{last}"
        );
    }
}
