//! The main thread's view of a running test: merges the workers' interval
//! reports in order, prints a live line (rewritten in place on a terminal,
//! one line per second otherwise, on stderr) and appends each interval to
//! the `--hlog` HdrHistogram interval log.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriter, IntervalLogWriterBuilder};

use crate::engine::{INTERVAL, IntervalReport, Msg, Shared};
use crate::report::fmt_us;
use crate::stats::{self, Counts};

type Hlog<'a, 'b> = IntervalLogWriter<'a, 'b, BufWriter<File>, V2DeflateSerializer>;

struct Pending {
    from: Vec<bool>,
    latency: Histogram<u64>,
    counts: Counts,
    warmup_ok: u64,
}

pub struct Progress {
    threads: usize,
    warmup: Duration,
    quiet: bool,
    tty: bool,
    pending: BTreeMap<u64, Pending>,
    done: Vec<bool>,
    next: u64,
    cumulative: Histogram<u64>,
    printed_inline: bool,
    /// The interval log's first write error: logging stopped there.
    log_failed: Option<anyhow::Error>,
}

impl Progress {
    pub fn new(threads: usize, warmup: Duration, quiet: bool) -> Self {
        Self {
            threads,
            warmup,
            quiet,
            tty: std::io::stderr().is_terminal(),
            pending: BTreeMap::new(),
            done: vec![false; threads],
            next: 0,
            cumulative: stats::new_histogram(),
            printed_inline: false,
            log_failed: None,
        }
    }

    /// Handles every message until the workers are gone. The interval log
    /// (`hlog`, created by the caller before the run, so that a bad path
    /// fails before it) gets its header at the first message, when the
    /// start time is known. A write that fails ends the log, not the
    /// progress lines; its error is returned at the end.
    pub fn consume(
        &mut self,
        rx: Receiver<Msg>,
        hlog: Option<File>,
        shared: &Shared,
    ) -> anyhow::Result<()> {
        let Ok(first) = rx.recv() else {
            return Ok(());
        };
        let Some(file) = hlog else {
            self.on(first, &mut None);
            for m in rx {
                self.on(m, &mut None);
            }
            return Ok(());
        };
        let mut file = BufWriter::new(file);
        let mut ser = V2DeflateSerializer::new();
        let mut builder = IntervalLogWriterBuilder::new();
        builder.add_comment("mcp-loadgen interval log: latency in microseconds, one histogram per second of the measured phase");
        if let Some(start) = shared.start_time() {
            builder.with_start_time(start).with_base_time(start);
        }
        let mut log = match builder.begin_log_with(&mut file, &mut ser) {
            Ok(log) => Some(log),
            Err(e) => {
                self.log_failed =
                    Some(anyhow::anyhow!("cannot write the interval log header: {e}"));
                None
            }
        };
        self.on(first, &mut log);
        for m in rx {
            self.on(m, &mut log);
        }
        self.flush(&mut log);
        drop(log);
        if let Some(e) = self.log_failed.take() {
            return Err(e);
        }
        file.flush().context("cannot write the interval log")?;
        Ok(())
    }

    fn on(&mut self, m: Msg, log: &mut Option<Hlog<'_, '_>>) {
        match m {
            Msg::Interval(r) => self.add(*r),
            Msg::Done { thread, .. } => {
                if let Some(d) = self.done.get_mut(thread) {
                    *d = true;
                }
            }
        }
        self.emit_ready(log)
    }

    fn add(&mut self, r: IntervalReport) {
        let threads = self.threads;
        let p = self.pending.entry(r.index).or_insert_with(|| Pending {
            from: vec![false; threads],
            latency: stats::new_histogram(),
            counts: Counts::default(),
            warmup_ok: 0,
        });
        if let Some(f) = p.from.get_mut(r.thread) {
            *f = true;
        }
        let _ = p.latency.add(&r.latency);
        p.counts.merge(&r.counts);
        p.warmup_ok += r.warmup_ok;
    }

    /// Emits intervals, in order, once every worker still running has
    /// reported them (a finished worker sends nothing more).
    fn emit_ready(&mut self, log: &mut Option<Hlog<'_, '_>>) {
        while let Some(entry) = self.pending.first_entry() {
            let complete = entry
                .get()
                .from
                .iter()
                .zip(&self.done)
                .all(|(got, done)| *got || *done);
            if !complete {
                break;
            }
            let (index, p) = entry.remove_entry();
            self.emit(index, p, log);
        }
    }

    fn flush(&mut self, log: &mut Option<Hlog<'_, '_>>) {
        while let Some((index, p)) = self.pending.pop_first() {
            self.emit(index, p, log);
        }
    }

    fn emit(&mut self, index: u64, p: Pending, log: &mut Option<Hlog<'_, '_>>) {
        self.next = index + 1;
        let _ = self.cumulative.add(&p.latency);
        let from = INTERVAL * index as u32;
        let warming = from + INTERVAL <= self.warmup;
        // Intervals are cut at the first tick past each second, so the one
        // that ends the warmup holds the first measured answers too: it is
        // logged when it has any (skipping it lost them from the log).
        if let Some(log) = log
            && (!warming || !p.latency.is_empty())
            && self.log_failed.is_none()
            && let Err(e) = log.write_histogram(&p.latency, from, INTERVAL, None)
        {
            // The log ends here; the progress lines go on.
            self.log_failed = Some(anyhow::anyhow!("cannot write the interval log: {e:?}"));
        }
        if self.quiet {
            return;
        }
        let secs = self.next;
        let line = if warming {
            format!("[{secs:>4}s] warming up: {} ok", p.warmup_ok)
        } else {
            let c = &p.counts;
            let q = |h: &Histogram<u64>, q: f64| {
                if h.is_empty() {
                    "-".to_owned()
                } else {
                    fmt_us(h.value_at_quantile(q))
                }
            };
            format!(
                "[{secs:>4}s] {} req/s ok, {} errors | this second p50 {} p99 {} max {} | so far p99 {}",
                c.ok,
                c.total_errors(),
                q(&p.latency, 0.5),
                q(&p.latency, 0.99),
                q(&p.latency, 1.0),
                q(&self.cumulative, 0.99),
            )
        };
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{line}");
            self.printed_inline = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// Ends an in-place progress line so the summary starts on its own.
    pub fn finish(&mut self) {
        if self.printed_inline {
            eprintln!();
            self.printed_inline = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(latency_us: &[u64]) -> Pending {
        let mut latency = stats::new_histogram();
        for &v in latency_us {
            stats::record(&mut latency, v);
        }
        Pending {
            from: vec![true],
            latency,
            counts: Counts::default(),
            warmup_ok: 3,
        }
    }

    /// The interval that ends a whole-second warmup also holds the first
    /// measured answers: they reach the log, and a warmup-only interval
    /// does not.
    #[test]
    fn measured_answers_in_the_interval_ending_the_warmup_are_logged() {
        let path = std::env::temp_dir().join(format!("progress-{}.hlog", std::process::id()));
        let mut file = BufWriter::new(File::create(&path).unwrap());
        let mut ser = V2DeflateSerializer::new();
        let mut log = Some(
            IntervalLogWriterBuilder::new()
                .begin_log_with(&mut file, &mut ser)
                .unwrap(),
        );
        let mut p = Progress::new(1, Duration::from_secs(2), true);
        p.emit(0, interval(&[]), &mut log);
        p.emit(1, interval(&[120, 130]), &mut log);
        p.emit(2, interval(&[140]), &mut log);
        drop(log);
        file.flush().unwrap();
        drop(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let histograms = text
            .lines()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
            .count();
        assert_eq!(histograms, 2, "{text}");
    }
}
