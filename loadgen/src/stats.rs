//! What a worker thread measures, and how threads' measurements merge.
//!
//! # Invariants
//! - Only successful, correlated, final responses of the measured phase are
//!   recorded in the latency histogram; errors are counted by kind, never
//!   folded into latency.
//! - Histograms span 1 µs to 60 s with 3 significant digits everywhere, so
//!   any two of them merge exactly (same bucket layout).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

/// Lowest trackable latency, in µs.
pub const HIST_LOW_US: u64 = 1;
/// Highest trackable latency: 60 s, in µs. Longer values are clamped to it
/// (and still counted), so one pathological response cannot fail a run.
pub const HIST_HIGH_US: u64 = 60_000_000;
pub const HIST_SIGFIG: u8 = 3;

pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that satisfy the constructor's rules
    // (low >= 1, high >= 2 * low, sigfig <= 5).
    Histogram::new_with_bounds(HIST_LOW_US, HIST_HIGH_US, HIST_SIGFIG)
        .unwrap_or_else(|_| unreachable!("constant histogram bounds are valid"))
}

/// Records `us`, clamped into the histogram's range.
pub fn record(h: &mut Histogram<u64>, us: u64) {
    // In range by the clamp, so it cannot fail.
    let _ = h.record(us.clamp(HIST_LOW_US, HIST_HIGH_US));
}

/// Records a span of `us` once per µs it lasted (at least once): the
/// histogram then holds the span that a moment picked at random falls in.
pub fn record_weighted(h: &mut Histogram<u64>, us: u64) {
    // In range by the clamp, so it cannot fail.
    let _ = h.record_n(us.clamp(HIST_LOW_US, HIST_HIGH_US), us.max(1));
}

/// Kinds of failure, counted separately. The names are part of the JSON
/// report (`errors_by_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorKind {
    /// A final `ErrorResponse`; also counted by code in `error_codes`.
    ErrorResponse,
    /// A final response of another payload type than the request asks for.
    KindMismatch,
    /// A response whose correlation id is no outstanding request of this
    /// connection (a wrong id, a duplicate final response, or a progress
    /// frame for a finished request). The first final answer of a request
    /// that timed out is not one of these: it is counted as `late`.
    UnknownCorrelation,
    /// A frame that failed verification as a `Response`.
    InvalidFrame,
    /// No final response within `--timeout`, or before the drain ended.
    Timeout,
    /// Outstanding when its connection failed.
    ConnectionLost,
    /// gRPC: a call ended with a non-OK status; also counted by code in
    /// `grpc_codes` (reported as `grpc_<code name>`).
    GrpcStatus,
    /// HTTP: a non-2xx status; also counted by status in `http_statuses`
    /// (reported as `http_<status>`).
    HttpStatus,
    /// A tool call answered with `isError` (HTTP), `is_error` (frames' `ToolResult`,
    /// gRPC's `CallToolResult`): the tool ran and failed.
    ToolError,
    /// HTTP: an answer that is no answer to the request: not HTTP, a body
    /// that is not JSON-RPC, garbage SSE, the wrong id, no `result` and no
    /// `error`, or an SSE stream that ended without the response.
    InvalidResponse,
    /// HTTP: the server closed the connection before the answer was
    /// complete. The generator reconnects (same session) and goes on.
    ConnectionClosed,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::ErrorResponse,
        ErrorKind::KindMismatch,
        ErrorKind::UnknownCorrelation,
        ErrorKind::InvalidFrame,
        ErrorKind::Timeout,
        ErrorKind::ConnectionLost,
        ErrorKind::GrpcStatus,
        ErrorKind::HttpStatus,
        ErrorKind::ToolError,
        ErrorKind::InvalidResponse,
        ErrorKind::ConnectionClosed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::ErrorResponse => "error_response",
            ErrorKind::KindMismatch => "kind_mismatch",
            ErrorKind::UnknownCorrelation => "unknown_correlation",
            ErrorKind::InvalidFrame => "invalid_frame",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ConnectionLost => "connection_lost",
            ErrorKind::GrpcStatus => "grpc",
            ErrorKind::HttpStatus => "http",
            ErrorKind::ToolError => "tool_error",
            ErrorKind::InvalidResponse => "invalid_response",
            ErrorKind::ConnectionClosed => "connection_closed",
        }
    }

    /// Whether this error is the server's well-formed answer (counted in
    /// `achieved_rps`), as opposed to no answer or a broken one.
    pub const fn is_answer(self) -> bool {
        matches!(
            self,
            ErrorKind::ErrorResponse
                | ErrorKind::GrpcStatus
                | ErrorKind::HttpStatus
                | ErrorKind::ToolError
        )
    }

    /// Whether this error ends a request (as opposed to a stray frame that
    /// belongs to no request).
    pub const fn ends_request(self) -> bool {
        !matches!(
            self,
            ErrorKind::UnknownCorrelation | ErrorKind::InvalidFrame
        )
    }
}

/// Counters of one phase (the measured one, or one progress interval).
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// Requests written.
    pub sent: u64,
    /// Requests that were due by the schedule (open loop; equals `sent` in
    /// closed loop). `intended - sent` were never sent: the generator or the
    /// window was behind.
    pub intended: u64,
    /// Successful, correlated final responses.
    pub ok: u64,
    pub errors: [u64; ErrorKind::ALL.len()],
    /// `ErrorResponse` codes.
    pub error_codes: BTreeMap<i32, u64>,
    /// gRPC status codes of `GrpcStatus` errors.
    pub grpc_codes: BTreeMap<i32, u64>,
    /// HTTP statuses of `HttpStatus` errors.
    pub http_statuses: BTreeMap<i32, u64>,
    /// Progress/log frames seen for outstanding requests.
    pub progress_frames: u64,
    /// Final answers that came after their request had timed out (each
    /// already counted as a `Timeout`; not an error a second time).
    pub late: u64,
}

impl Counts {
    pub fn error(&mut self, kind: ErrorKind) {
        self.errors[kind as usize] += 1;
    }

    pub fn total_errors(&self) -> u64 {
        self.errors.iter().sum()
    }

    /// Requests that reached an outcome: success or a request-ending error.
    pub fn completed(&self) -> u64 {
        self.ok
            + ErrorKind::ALL
                .iter()
                .filter(|k| k.ends_request())
                .map(|k| self.errors[*k as usize])
                .sum::<u64>()
    }

    pub fn merge(&mut self, o: &Counts) {
        self.sent += o.sent;
        self.intended += o.intended;
        self.ok += o.ok;
        for (a, b) in self.errors.iter_mut().zip(o.errors) {
            *a += b;
        }
        for (c, n) in &o.error_codes {
            *self.error_codes.entry(*c).or_default() += n;
        }
        for (c, n) in &o.grpc_codes {
            *self.grpc_codes.entry(*c).or_default() += n;
        }
        for (c, n) in &o.http_statuses {
            *self.http_statuses.entry(*c).or_default() += n;
        }
        self.progress_frames += o.progress_frames;
        self.late += o.late;
    }

    /// `errors_by_kind` for the report: the kinds that occurred, with
    /// error responses split by code name.
    pub fn by_kind(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for k in ErrorKind::ALL {
            let n = self.errors[k as usize];
            if n > 0
                && !matches!(
                    k,
                    ErrorKind::ErrorResponse | ErrorKind::GrpcStatus | ErrorKind::HttpStatus
                )
            {
                m.insert(k.as_str().to_owned(), n);
            }
        }
        for (code, n) in &self.error_codes {
            let name = mcp_schema::ErrorCode::from_code(*code)
                .map(|c| c.as_str().to_owned())
                .unwrap_or_else(|| format!("code_{code}"));
            *m.entry(format!("error_response.{name}")).or_default() += n;
        }
        for (code, n) in &self.grpc_codes {
            *m.entry(format!("grpc_{}", grpc_code_name(*code)))
                .or_default() += n;
        }
        for (status, n) in &self.http_statuses {
            *m.entry(format!("http_{status}")).or_default() += n;
        }
        m
    }
}

/// The snake-case name of a gRPC status code (`RESOURCE_EXHAUSTED` →
/// `resource_exhausted`), or `code_<n>` for one outside the standard 0..=16.
pub fn grpc_code_name(code: i32) -> String {
    const NAMES: [&str; 17] = [
        "ok",
        "cancelled",
        "unknown",
        "invalid_argument",
        "deadline_exceeded",
        "not_found",
        "already_exists",
        "permission_denied",
        "resource_exhausted",
        "failed_precondition",
        "aborted",
        "out_of_range",
        "unimplemented",
        "internal",
        "unavailable",
        "data_loss",
        "unauthenticated",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("code_{code}"), |s| (*s).to_owned())
}

/// Everything one worker thread measured, handed back when it ends.
#[derive(Clone, Debug)]
pub struct ThreadStats {
    pub counts: Counts,
    pub latency: Histogram<u64>,
    /// Open loop: how late each request was written after its intended
    /// time (generator or window lag), in µs.
    pub send_lag: Histogram<u64>,
    /// Open loop: the part of `send_lag` that was the generator's own: from
    /// when a request was both due and let go by its window, in µs.
    pub own_lag: Histogram<u64>,
    /// Open loop, measured phase: the length of each turn of the worker's
    /// task loop while its alarm clock spun (`alarm.rs`), in µs: how long
    /// an answer could wait to be read.
    pub turns: Histogram<u64>,
    /// Open loop, measured phase: how late a thread of the generator that
    /// sleeps 1 ms at a time woke each time, in µs (jHiccup's method): the
    /// stalls of the whole process (descheduled, stopped, starved of CPU),
    /// which no worker can see in its own turns while it is the one stalled.
    pub stalls: Histogram<u64>,
    /// When the last request was written / the last final response came,
    /// relative to the run start.
    pub last_send: std::time::Duration,
    pub last_response: std::time::Duration,
    /// Requests written, the warmup's included: `--requests` counts these,
    /// so a run that sent them all ended on its quota.
    pub sent_all: u64,
    /// The worker's own CPU over the measured phase (`None`: not measured,
    /// e.g. the run stopped before it).
    pub cpu: Option<CpuUse>,
}

/// Worker threads' own CPU over the measured phase, summed over threads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuUse {
    /// Worker threads measured.
    pub threads: usize,
    /// CPU time (user + system) of those threads.
    pub cpu: std::time::Duration,
    /// Cores busy: each thread's CPU time over its measured window, summed.
    pub cores: f64,
    /// Of `cores`, the share spent spinning for precise send times with
    /// nothing else to do (`alarm.rs`), as cores.
    pub idle_spin_cores: f64,
}

impl CpuUse {
    pub fn merge(&mut self, o: &CpuUse) {
        self.threads += o.threads;
        self.cpu += o.cpu;
        self.cores += o.cores;
        self.idle_spin_cores += o.idle_spin_cores;
    }
}

impl Default for ThreadStats {
    fn default() -> Self {
        Self {
            counts: Counts::default(),
            latency: new_histogram(),
            send_lag: new_histogram(),
            own_lag: new_histogram(),
            turns: new_histogram(),
            stalls: new_histogram(),
            last_send: Default::default(),
            last_response: Default::default(),
            sent_all: 0,
            cpu: None,
        }
    }
}

impl ThreadStats {
    pub fn merge(&mut self, o: &ThreadStats) {
        self.counts.merge(&o.counts);
        // Same bounds on both sides: cannot fail.
        let _ = self.latency.add(&o.latency);
        let _ = self.send_lag.add(&o.send_lag);
        let _ = self.own_lag.add(&o.own_lag);
        let _ = self.turns.add(&o.turns);
        let _ = self.stalls.add(&o.stalls);
        self.last_send = self.last_send.max(o.last_send);
        self.last_response = self.last_response.max(o.last_response);
        self.sent_all += o.sent_all;
        match (&mut self.cpu, &o.cpu) {
            (Some(a), Some(b)) => a.merge(b),
            (a @ None, Some(b)) => *a = Some(*b),
            (_, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_reported_by_kind_and_code() {
        let mut c = Counts::default();
        c.error(ErrorKind::UnknownCorrelation);
        c.error(ErrorKind::ErrorResponse);
        *c.error_codes.entry(-32601).or_default() += 1;
        c.error(ErrorKind::ErrorResponse);
        *c.error_codes.entry(-1).or_default() += 1;
        c.ok = 5;
        let k = c.by_kind();
        assert_eq!(k["unknown_correlation"], 1);
        assert_eq!(k["error_response.not_found"], 1);
        assert_eq!(k["error_response.code_-1"], 1);
        assert_eq!(c.total_errors(), 3);
        assert_eq!(c.completed(), 7, "a stray frame ends no request");
    }

    #[test]
    fn grpc_statuses_are_reported_by_code_name() {
        let mut c = Counts::default();
        for code in [8, 8, 5, 99] {
            c.error(ErrorKind::GrpcStatus);
            *c.grpc_codes.entry(code).or_default() += 1;
        }
        let k = c.by_kind();
        assert_eq!(k["grpc_resource_exhausted"], 2);
        assert_eq!(k["grpc_not_found"], 1);
        assert_eq!(k["grpc_code_99"], 1);
        assert!(!k.contains_key("grpc"));
        assert_eq!(c.total_errors(), 4);
        assert_eq!(c.completed(), 4);
    }

    #[test]
    fn http_statuses_are_reported_by_status() {
        let mut c = Counts::default();
        for status in [404, 404, 500] {
            c.error(ErrorKind::HttpStatus);
            *c.http_statuses.entry(status).or_default() += 1;
        }
        c.error(ErrorKind::InvalidResponse);
        let k = c.by_kind();
        assert_eq!(k["http_404"], 2);
        assert_eq!(k["http_500"], 1);
        assert_eq!(k["invalid_response"], 1);
        assert!(!k.contains_key("http"));
        assert_eq!(c.completed(), 4);
    }

    #[test]
    fn out_of_range_latencies_are_clamped_not_lost() {
        let mut h = new_histogram();
        record(&mut h, 0);
        record(&mut h, 3_600_000_000);
        assert_eq!(h.len(), 2);
        assert!(h.max() >= HIST_HIGH_US);
    }
}
