//! Errors of the WASM host: refusing a component at load, and ending a call.
//!
//! # Invariants
//! - A router's own answer (`tool-error`, `resource-error`, ...) is a normal
//!   outcome ([`CallError::is_fault`] is false); only faults replace an
//!   instance.

use std::path::PathBuf;
use std::time::Duration;

use super::bindings::types::{CompletionError, PromptError, ResourceError, ToolError};

/// Why a call did not produce the router's success value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// Every instance is busy and the wait queue is full; refused at once.
    /// Retryable: nothing ran.
    #[error("router overloaded: all instances busy and the wait queue is full")]
    Overloaded,
    /// A new session of a session-affine router found the shard's session
    /// cap (`max_sessions_per_shard`) reached with every session's call in
    /// flight, so none could be evicted. Retryable: nothing ran.
    #[error("router overloaded: every session instance of this shard has a call in flight")]
    SessionsFull,
    /// The per-call deadline passed (guest spinning, or blocked in WASI);
    /// the instance was discarded. Not retryable: the guest may have done
    /// part of the work.
    #[error("router call exceeded its deadline of {0:?}")]
    DeadlineExceeded(Duration),
    /// The guest trapped (`unreachable`, a panic, a bad memory access...);
    /// the instance was discarded. Not retryable: a trap is deterministic.
    #[error("router trapped: {0}")]
    Trap(String),
    /// The guest asked for more memory or table space than its limits allow
    /// and then trapped; the instance was discarded. Not retryable.
    #[error("router ran out of memory (its store limits refused to grow)")]
    OutOfMemory,
    /// The guest exhausted the wasm stack (`max_wasm_stack`); the instance was
    /// discarded. Not retryable.
    #[error("router overflowed its stack")]
    StackOverflow,
    /// A fresh instance could not be made (pooling slots exhausted, or the
    /// component's start failed). Retryable: later calls try again.
    #[error("could not instantiate the router: {0}")]
    Instantiate(String),
    /// The router answered with text in a `json` field that is not JSON.
    /// The instance is kept (it did not fault). Not retryable.
    #[error("router returned malformed JSON in `{field}`: {error}")]
    MalformedOutput {
        /// Which field of the answer was malformed.
        field: &'static str,
        /// The parser's message.
        error: String,
    },
    /// The answer would take more than the router's `max_result_bytes` of
    /// host memory; it was refused while being read out of the guest,
    /// before the copy, and the instance was discarded. Not retryable.
    #[error("router answer exceeds max_result_bytes ({limit} bytes)")]
    ResultTooLarge {
        /// The router's `max_result_bytes`.
        limit: usize,
    },
    /// Any other host-side failure of the call; the instance was discarded.
    #[error("router call failed: {0}")]
    Fault(String),
    /// `call-tool` answered `tool-error`: a normal outcome, not a fault.
    #[error("tool error: {0:?}")]
    Tool(ToolError),
    /// `read-resource` answered `resource-error`: a normal outcome.
    #[error("resource error: {0:?}")]
    Resource(ResourceError),
    /// `get-prompt` answered `prompt-error`: a normal outcome.
    #[error("prompt error: {0:?}")]
    Prompt(PromptError),
    /// `complete` answered `completion-error`: a normal outcome.
    #[error("completion error: {0:?}")]
    Completion(CompletionError),
}

impl CallError {
    /// True when sending the same call again (later, or to another shard) may
    /// succeed and cannot duplicate work: nothing ran in the guest.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Overloaded | Self::SessionsFull | Self::Instantiate(_)
        )
    }

    /// True when the host, not the router's own logic, ended the call: the
    /// error is the router's fault or the broker's limits, and (except for
    /// `Overloaded`, `SessionsFull`, `Instantiate` and `MalformedOutput`) the instance that
    /// ran it was replaced.
    pub fn is_fault(&self) -> bool {
        !matches!(
            self,
            Self::Tool(_) | Self::Resource(_) | Self::Prompt(_) | Self::Completion(_)
        )
    }
}

/// Why a router component was refused at load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The `.wasm` file could not be read.
    #[error("router `{router}`: cannot read {path}: {source}{hint}")]
    Read {
        /// Router name from the spec.
        router: String,
        /// The file.
        path: PathBuf,
        /// How to build it, when it is a bundled router's file; else "".
        hint: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid component, or does not compile.
    #[error("router `{router}`: {path} is not a loadable component: {message}")]
    Compile {
        /// Router name from the spec.
        router: String,
        /// The file.
        path: PathBuf,
        /// Wasmtime's message.
        message: String,
    },
    /// The component does not fit the host: every problem is listed.
    #[error("router `{router}`: component {path} refused: {}", problems.join("; "))]
    Incompatible {
        /// Router name from the spec.
        router: String,
        /// The file.
        path: PathBuf,
        /// One line per problem, each naming the import or export.
        problems: Vec<String>,
    },
    /// A spec value is out of range.
    #[error("router `{router}`: invalid spec: {message}")]
    Spec {
        /// Router name from the spec.
        router: String,
        /// What is wrong.
        message: String,
    },
    /// A WASI grant could not be applied (e.g. the preopened dir is missing).
    #[error("router `{router}`: grant refused: {message}")]
    Grant {
        /// Router name from the spec.
        router: String,
        /// What is wrong.
        message: String,
    },
    /// Instantiating the component, or reading its metadata, failed.
    #[error("router `{router}`: reading metadata failed: {source}")]
    Metadata {
        /// Router name from the spec.
        router: String,
        /// The failed call.
        #[source]
        source: CallError,
    },
}

/// Why the process-wide host could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The wasmtime engine rejected the configuration.
    #[error("wasm engine configuration refused: {0}")]
    Engine(String),
    /// The WASI I/O runtime or the epoch ticker thread could not start.
    #[error("wasm host threads could not start: {0}")]
    Threads(#[from] std::io::Error),
}
