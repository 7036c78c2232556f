//! `chaos`: misbehaving tools for the host's reliability tests.
//!
//! Every tool and the outcome the host gives it (`broker::wasm::CallError`):
//!
//! | tool | does | host outcome |
//! |---|---|---|
//! | `trap` | executes `unreachable` | `Trap`, instance replaced |
//! | `panic` | `panic!` (panic = abort, so a trap) | `Trap`, instance replaced |
//! | `loop` | spins forever without host calls | `DeadlineExceeded`, instance replaced |
//! | `alloc` | allocates 1 MiB chunks until memory growth is refused | `OutOfMemory`, instance replaced |
//! | `recurse` | recurses until the wasm stack overflows | `StackOverflow`, instance replaced |
//! | `sleep {"ms"}` | `std::thread::sleep` (a WASI clocks poll) | completes after `ms` |
//! | `spin {"ms"}` | busy loop reading the monotonic clock | completes after `ms`, or `DeadlineExceeded` |
//! | `elicit` | returns `response::elicit` | `Ok(Response::Elicit)` |
//! | `malformed` | structured content that is not JSON | `MalformedOutput` |
//! | `fail` | returns `tool-error::execution-error` | `ToolError` (not a fault) |
//! | `read_file {"path"}` | `std::fs::read_to_string` | text, or `ToolError` without a grant |
//! | `env {"name"}` | `std::env::var` | value, or `ToolError` when not granted |
//! | `print {"text"}` | writes to stdout and stderr | completes (output discarded unless granted) |
//! | `http_fields {"name", "value"}` | builds a `wasi:http/types` header list and reads `name` back (it imports the types alone: no request can be sent) | the value, on any router; a forbidden header is a `ToolError` |
//! | `fanout {"blocks", "bytes"}` | `blocks` text blocks that all point at one string of `bytes` bytes | `ResultTooLarge` past `max_result_bytes`, instance replaced |
//! | `big_state {"bytes", "key_bytes"?}` | elicits with a state (`mcp-broker/state`) of a `bytes`-byte string and an input key of `key_bytes` bytes | HTTP 2026-07-28: -32603 past 4 KiB of state or 64 bytes of key |
//! | `bad_set {"set"}` | asks the set of questions `set` (`mcp-broker/input-requests`), the string's text as it is | HTTP: -32603 naming the fault of a set that cannot be asked |
//!
//! # Invariants
//! - Each tool misbehaves in exactly one way, so a test names its cause.

wit_bindgen::generate!({ path: "../../wit", world: "mcp-router" });

use std::io::Write;
use std::time::{Duration, Instant};

use exports::wasix::mcp::router::{
    CompletionError, CompletionRequest, CompletionResponse, ContentBlock, ElicitationRequest,
    GetPromptResult, Guest, McpResource, MetaEntry, Prompt, PromptError, ReadResourceResult,
    ResourceError, Response, ServerCapabilities, ServerDescription, TextContent, Tool, ToolError,
    ToolResult, ToolsCapability,
};

struct Chaos;

fn completed(text: String, structured: Option<String>) -> Response {
    Response::Completed(ToolResult {
        content: vec![ContentBlock::Text(TextContent {
            text,
            annotations: None,
        })],
        structured_content: structured,
        progress: None,
        meta: None,
        is_error: None,
    })
}

fn arg<'a>(args: &'a serde_json::Value, name: &str) -> Result<&'a serde_json::Value, ToolError> {
    args.get(name)
        .ok_or_else(|| ToolError::InvalidParameters(format!("`{name}` is required")))
}

fn str_arg<'a>(args: &'a serde_json::Value, name: &str) -> Result<&'a str, ToolError> {
    arg(args, name)?
        .as_str()
        .ok_or_else(|| ToolError::InvalidParameters(format!("`{name}` must be a string")))
}

fn millis(args: &serde_json::Value) -> Result<Duration, ToolError> {
    arg(args, "ms")?
        .as_u64()
        .map(Duration::from_millis)
        .ok_or_else(|| ToolError::InvalidParameters("`ms` must be a non-negative integer".into()))
}

/// Recurses until the host's `max_wasm_stack` is exhausted. The result is
/// used after the call so that the recursion is not a tail call, and no local
/// has its address taken, so the frames live on the wasm stack (which the
/// host bounds) and not on the shadow stack in linear memory.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if depth == u64::MAX {
        return 0;
    }
    recurse(depth + 1).wrapping_mul(31).wrapping_add(depth)
}

/// `blocks` text blocks whose strings all point at one buffer of `bytes`
/// bytes: what any guest that lowers its own answer can return, made here
/// from Rust by aliasing. The guest holds `bytes` once; a host that lifted
/// it naively would copy it `blocks` times.
fn fanout(blocks: usize, bytes: usize) -> Response {
    let mut text = std::mem::ManuallyDrop::new("x".repeat(bytes));
    let (ptr, len, cap) = (text.as_mut_ptr(), text.len(), text.capacity());
    let content = (0..blocks)
        .map(|_| {
            // SAFETY: deliberately not sound Rust: every block claims the
            // same buffer. Nothing in this guest reads or drops them: the
            // canonical ABI lowering only records each (ptr, len), and the
            // post-return that would free them runs only after the host
            // has accepted the answer, which it must not do for this one
            // (`max_result_bytes`); the instance is discarded instead.
            let text = unsafe { String::from_raw_parts(ptr, len, cap) };
            ContentBlock::Text(TextContent {
                text,
                annotations: None,
            })
        })
        .collect();
    Response::Completed(ToolResult {
        content,
        structured_content: None,
        progress: None,
        meta: None,
        is_error: None,
    })
}

fn tool(name: &str, description: &str) -> Tool {
    Tool {
        name: name.into(),
        title: None,
        description: description.into(),
        input_schema: r#"{"type":"object"}"#.into(),
        output_schema: None,
        annotations: None,
        meta: None,
    }
}

impl Guest for Chaos {
    fn name() -> String {
        "chaos".into()
    }

    fn title() -> Option<String> {
        Some("Chaos".into())
    }

    fn instructions() -> String {
        "Tools that misbehave on purpose: trap, panic, loop, alloc, recurse, sleep, spin, \
         elicit, malformed, fail, fanout; read_file, env and print probe the WASI grants."
            .into()
    }

    fn describe_server() -> ServerDescription {
        ServerDescription {
            name: Self::name(),
            title: Self::title(),
            capabilities: ServerCapabilities {
                prompts: None,
                resources: None,
                tools: Some(ToolsCapability {
                    list_changed: Some(false),
                }),
                completions: None,
            },
            resources: None,
            resource_metadata: None,
            meta: None,
        }
    }

    fn list_tools() -> Vec<Tool> {
        vec![
            tool("trap", "Executes `unreachable`."),
            tool("panic", "Panics (a trap: panic = abort)."),
            tool("loop", "Loops forever."),
            tool("alloc", "Allocates until memory growth is refused."),
            tool("recurse", "Recurses until the stack overflows."),
            tool("sleep", "Sleeps `ms` milliseconds through WASI clocks."),
            tool("spin", "Busy-waits `ms` milliseconds."),
            tool("elicit", "Asks the client for more input."),
            tool("malformed", "Returns structured content that is not JSON."),
            tool("fail", "Returns a tool execution error."),
            tool("read_file", "Reads the file at `path`."),
            tool("env", "Reads the environment variable `name`."),
            tool("print", "Writes `text` to stdout and stderr."),
            tool(
                "http_fields",
                "Builds a wasi:http header list holding `name`: `value` and reads it back.",
            ),
            tool(
                "fanout",
                "Returns `blocks` text blocks that all point at one string of `bytes` bytes.",
            ),
            tool(
                "big_state",
                "Elicits with a state of a `bytes`-byte string and an input key of `key_bytes` bytes.",
            ),
            tool(
                "bad_set",
                "Asks the set of questions `set` (text), however malformed.",
            ),
        ]
    }

    fn call_tool(tool_name: String, arguments: String) -> Result<Response, ToolError> {
        let args: serde_json::Value = if arguments.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&arguments)
                .map_err(|e| ToolError::InvalidParameters(format!("arguments: {e}")))?
        };
        match tool_name.as_str() {
            "trap" => core::arch::wasm32::unreachable(),
            "panic" => panic!("chaos: requested panic"),
            #[allow(clippy::empty_loop)]
            "loop" => loop {},
            "alloc" => {
                let mut chunks: Vec<Vec<u8>> = Vec::new();
                loop {
                    // Touch every chunk so that nothing is optimised away.
                    chunks.push(vec![1u8; 1 << 20]);
                    core::hint::black_box(&chunks);
                }
            }
            "recurse" => {
                let r = recurse(core::hint::black_box(0));
                Ok(completed(r.to_string(), None))
            }
            "sleep" => {
                let d = millis(&args)?;
                let start = Instant::now();
                std::thread::sleep(d);
                Ok(completed(format!("slept {} ms", start.elapsed().as_millis()), None))
            }
            "spin" => {
                let d = millis(&args)?;
                let start = Instant::now();
                let mut spins: u64 = 0;
                while start.elapsed() < d {
                    spins += 1;
                }
                Ok(completed(format!("spun {spins} times"), None))
            }
            "elicit" => Ok(Response::Elicit(ElicitationRequest {
                title: Some("Confirm".into()),
                message: "Which environment should the deployment go to?".into(),
                schema: r#"{"type":"object","properties":{"environment":{"type":"string","enum":["staging","production"]}},"required":["environment"]}"#.into(),
                annotations: None,
                meta: None,
            })),
            "malformed" => Ok(completed("structured content follows".into(), Some("{\"unterminated\": [1, 2".into()))),
            "fail" => Err(ToolError::ExecutionError("chaos: requested failure".into())),
            "read_file" => {
                let path = str_arg(&args, "path")?;
                std::fs::read_to_string(path)
                    .map(|text| completed(text, None))
                    .map_err(|e| ToolError::ExecutionError(format!("read {path}: {e}")))
            }
            "env" => {
                let name = str_arg(&args, "name")?;
                std::env::var(name)
                    .map(|v| completed(v, None))
                    .map_err(|e| ToolError::ExecutionError(format!("env {name}: {e}")))
            }
            "print" => {
                let text = str_arg(&args, "text")?;
                let out = writeln!(std::io::stdout(), "{text}");
                let err = writeln!(std::io::stderr(), "{text}");
                out.and(err)
                    .map(|()| completed("printed".into(), None))
                    .map_err(|e| ToolError::ExecutionError(format!("print: {e}")))
            }
            "http_fields" => {
                let (name, value) = (str_arg(&args, "name")?, str_arg(&args, "value")?);
                let fields = wasi::http::types::Fields::from_list(&[(
                    name.to_owned(),
                    value.as_bytes().to_vec(),
                )])
                .map_err(|e| ToolError::ExecutionError(format!("fields: {e:?}")))?;
                let read: Vec<String> = fields
                    .get(&name.to_owned())
                    .iter()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect();
                Ok(completed(read.join(", "), None))
            }
            "fanout" => {
                let count = |name| {
                    arg(&args, name)?
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| {
                            ToolError::InvalidParameters(format!("`{name}` must be a count"))
                        })
                };
                Ok(fanout(count("blocks")?, count("bytes")?))
            }
            "big_state" => {
                let count = |name| {
                    args.get(name)
                        .map(|v| {
                            v.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
                                ToolError::InvalidParameters(format!("`{name}` must be a count"))
                            })
                        })
                        .transpose()
                };
                let bytes = count("bytes")?.unwrap_or(0);
                let mut meta = vec![MetaEntry {
                    key: "mcp-broker/state".into(),
                    value: serde_json::Value::String("s".repeat(bytes)).to_string(),
                }];
                if let Some(k) = count("key_bytes")? {
                    meta.push(MetaEntry {
                        key: "mcp-broker/input-key".into(),
                        value: serde_json::Value::String("k".repeat(k)).to_string(),
                    });
                }
                Ok(Response::Elicit(ElicitationRequest {
                    title: None,
                    message: "A question with a large state".into(),
                    schema: r#"{"type":"object","properties":{}}"#.into(),
                    annotations: None,
                    meta: Some(meta),
                }))
            }
            "bad_set" => {
                let set = args.get("set").and_then(serde_json::Value::as_str).ok_or_else(|| {
                    ToolError::InvalidParameters("`set` (string) is required".into())
                })?;
                let mut r = completed("a set asked".into(), None);
                if let Response::Completed(t) = &mut r {
                    t.meta = Some(vec![MetaEntry {
                        key: "mcp-broker/input-requests".into(),
                        value: set.into(),
                    }]);
                }
                Ok(r)
            }
            other => Err(ToolError::NotFound(format!("no tool `{other}`"))),
        }
    }

    fn list_resources() -> Vec<McpResource> {
        Vec::new()
    }

    fn read_resource(uri: String) -> Result<ReadResourceResult, ResourceError> {
        Err(ResourceError::NotFound(format!(
            "chaos has no resource `{uri}`"
        )))
    }

    fn list_prompts() -> Vec<Prompt> {
        Vec::new()
    }

    fn get_prompt(prompt_name: String) -> Result<GetPromptResult, PromptError> {
        Err(PromptError::NotFound(format!(
            "chaos has no prompt `{prompt_name}`"
        )))
    }

    fn complete(_request: CompletionRequest) -> Result<CompletionResponse, CompletionError> {
        Err(CompletionError::NotFound(
            "chaos offers no completions".into(),
        ))
    }
}

export!(Chaos);
