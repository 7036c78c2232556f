//! Proptest strategies shared by the property tests: what an upstream that
//! is buggy, hostile or behind a broken proxy may send. Generic JSON finds
//! crashes in any shape; the MCP-shaped strategies put the keys the router
//! reads where it reads them, with values of the wrong type now and then,
//! so that the mapping's own paths run too.

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value};

/// Keys the router looks up somewhere: an object of random keys would
/// almost never hold one.
const KEYS: &[&str] = &[
    "jsonrpc",
    "id",
    "method",
    "params",
    "result",
    "error",
    "code",
    "message",
    "data",
    "uri",
    "progressToken",
    "progress",
    "total",
    "level",
    "logger",
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
    "_meta",
    "type",
    "text",
    "blob",
    "resource",
    "content",
    "structuredContent",
    "isError",
    "mimeType",
    "capabilities",
    "tools",
    "serverInfo",
    "supportedVersions",
    "resultType",
    "inputRequests",
    "requestState",
    "nextCursor",
    "properties",
    "x-mcp-header",
    "io.modelcontextprotocol/serverInfo",
];

/// Strings the router compares against.
const WORDS: &[&str] = &[
    "",
    "2026-07-28",
    "2025-06-18",
    "input_required",
    "complete",
    "required",
    "text",
    "image",
    "audio",
    "resource_link",
    "resource",
    "user",
    "assistant",
    "message",
    "string",
    "integer",
    "boolean",
    "ping",
    "notifications/progress",
    "notifications/message",
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "elicitation/create",
    "1",
    "=?base64?eA==?=",
];

/// Numbers as written, at the extremes: the crate enables serde_json's
/// `arbitrary_precision`, so a literal past u64 or f64 stays a number
/// whose every accessor must be handled.
const LITERALS: &[&str] = &[
    "0",
    "-0",
    "-0.0e-0",
    "1",
    "2",
    "0.1",
    "1E5",
    "1e400",
    "-1e400",
    "1e-400",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "123456789012345678901234567890.5",
    "-98765432109876543210",
];

pub fn number() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("JSON has no NaN or infinity", |f| {
            serde_json::Number::from_f64(f).map(Value::Number)
        }),
        select(LITERALS).prop_map(|n| serde_json::from_str(n).expect("a JSON number")),
    ]
    .boxed()
}

/// Words the router knows, or any characters (control characters, NUL,
/// lone combining marks, …).
pub fn string() -> BoxedStrategy<String> {
    prop_oneof![
        select(WORDS).prop_map(str::to_owned),
        prop::collection::vec(any::<char>(), 0..10).prop_map(String::from_iter),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![3 => select(KEYS).prop_map(str::to_owned), 1 => string()].boxed()
}

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        string().prop_map(Value::String),
    ]
    .boxed()
}

/// Any JSON value of bounded depth and size.
pub fn json() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
        .boxed()
}

/// `s` mostly, any JSON now and then (a field of the wrong type).
pub fn or_any(s: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Value> {
    prop_oneof![4 => s, 1 => json()].boxed()
}

pub fn text() -> BoxedStrategy<Value> {
    or_any(string().prop_map(Value::String))
}

fn word(words: &'static [&'static str]) -> BoxedStrategy<Value> {
    or_any(select(words).prop_map(Value::from))
}

fn flag() -> BoxedStrategy<Value> {
    or_any(any::<bool>().prop_map(Value::Bool))
}

fn list(item: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    or_any(prop::collection::vec(item, 0..4).prop_map(Value::Array))
}

/// An object holding some of `fields` (each present or not), and now and
/// then a key of its own.
pub fn object(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> BoxedStrategy<Value> {
    let present: Vec<_> = fields
        .into_iter()
        .map(|(k, v)| prop::option::weighted(0.7, v.prop_map(move |v| (k.to_owned(), v))))
        .collect();
    (present, prop::collection::vec((key(), json()), 0..2))
        .prop_map(|(fields, extra)| {
            let mut m: Map<String, Value> = extra.into_iter().collect();
            m.extend(fields.into_iter().flatten());
            Value::Object(m)
        })
        .boxed()
}

/// A `_meta` object: the key MCP reserves for itself among others.
pub fn meta() -> BoxedStrategy<Value> {
    or_any(
        prop::collection::vec(
            (
                prop_oneof![
                    Just("io.modelcontextprotocol/serverInfo".to_owned()),
                    Just("io.modelcontextprotocol/x".to_owned()),
                    string(),
                ],
                json(),
            ),
            0..4,
        )
        .prop_map(|kv| Value::Object(kv.into_iter().collect())),
    )
}

pub fn annotations() -> BoxedStrategy<Value> {
    object(vec![
        ("audience", list(word(&["user", "assistant", "robot"]))),
        ("priority", or_any(number())),
        ("lastModified", text()),
        ("readOnlyHint", flag()),
        ("destructiveHint", flag()),
        ("title", text()),
    ])
}

pub fn tool() -> BoxedStrategy<Value> {
    object(vec![
        ("name", text()),
        ("title", text()),
        ("description", text()),
        ("inputSchema", json()),
        ("outputSchema", json()),
        ("annotations", annotations()),
        ("_meta", meta()),
        (
            "execution",
            object(vec![(
                "taskSupport",
                word(&["required", "optional", "forbidden"]),
            )]),
        ),
    ])
}

fn embedded() -> BoxedStrategy<Value> {
    object(vec![
        ("uri", text()),
        ("title", text()),
        ("description", text()),
        ("mimeType", text()),
        ("text", text()),
        ("blob", text()),
    ])
}

pub fn content_block() -> BoxedStrategy<Value> {
    object(vec![
        (
            "type",
            word(&[
                "text",
                "image",
                "audio",
                "resource_link",
                "resource",
                "hologram",
            ]),
        ),
        ("text", text()),
        ("data", text()),
        ("mimeType", text()),
        ("uri", text()),
        ("name", text()),
        ("title", text()),
        ("description", text()),
        ("annotations", annotations()),
        ("resource", embedded()),
    ])
}

pub fn tool_result() -> BoxedStrategy<Value> {
    object(vec![
        ("content", list(content_block())),
        ("structuredContent", json()),
        ("isError", flag()),
        ("_meta", meta()),
    ])
}

pub fn resource() -> BoxedStrategy<Value> {
    object(vec![
        ("uri", text()),
        ("uriTemplate", text()),
        ("name", text()),
        ("title", text()),
        ("description", text()),
        ("mimeType", text()),
        ("annotations", annotations()),
    ])
}

pub fn prompt() -> BoxedStrategy<Value> {
    object(vec![
        ("name", text()),
        ("description", text()),
        (
            "arguments",
            list(object(vec![
                ("name", text()),
                ("description", text()),
                ("required", flag()),
            ])),
        ),
    ])
}

pub fn prompt_result() -> BoxedStrategy<Value> {
    object(vec![
        ("description", text()),
        (
            "messages",
            list(object(vec![
                ("role", word(&["user", "assistant", "system"])),
                ("content", content_block()),
            ])),
        ),
    ])
}

pub fn read_result() -> BoxedStrategy<Value> {
    object(vec![("contents", list(embedded()))])
}

pub fn completion_result() -> BoxedStrategy<Value> {
    object(vec![
        (
            "completion",
            object(vec![
                ("values", list(text())),
                ("total", or_any(number())),
                ("hasMore", flag()),
            ]),
        ),
        ("_meta", meta()),
    ])
}

fn capabilities() -> BoxedStrategy<Value> {
    let cap = || object(vec![("listChanged", flag()), ("subscribe", flag())]);
    object(vec![
        ("tools", cap()),
        ("resources", cap()),
        ("prompts", cap()),
        ("completions", cap()),
    ])
}

/// An `initialize` result, or 2026-07-28's `server/discover` one.
pub fn init_result() -> BoxedStrategy<Value> {
    let info = || {
        object(vec![
            ("name", text()),
            ("title", text()),
            ("version", text()),
        ])
    };
    object(vec![
        (
            "protocolVersion",
            word(&["2025-06-18", "2026-07-28", "1999-01-01"]),
        ),
        (
            "supportedVersions",
            list(word(&["2025-06-18", "2026-07-28"])),
        ),
        ("capabilities", or_any(capabilities())),
        ("serverInfo", info()),
        (
            "_meta",
            or_any(object(vec![("io.modelcontextprotocol/serverInfo", info())])),
        ),
        ("instructions", text()),
    ])
}

/// A 2026-07-28 `InputRequiredResult` (or something like it).
pub fn input_required() -> BoxedStrategy<Value> {
    object(vec![
        ("resultType", word(&["input_required", "complete"])),
        (
            "inputRequests",
            or_any(
                prop::collection::vec((string(), json()), 0..3)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ),
        ),
        ("requestState", text()),
    ])
}

/// One result that answers every method at once: whichever the request
/// was, the keys it reads are there (or not, or of the wrong type).
pub fn any_result() -> BoxedStrategy<Value> {
    (
        init_result(),
        tool_result(),
        input_required(),
        object(vec![
            ("tools", list(tool())),
            ("resources", list(resource())),
            ("resourceTemplates", list(resource())),
            ("prompts", list(prompt())),
            ("nextCursor", text()),
        ]),
        prompt_result(),
        read_result(),
        completion_result(),
    )
        .prop_map(|parts| {
            let mut m = Map::new();
            let (a, b, c, d, e, f, g) = parts;
            for part in [a, b, c, d, e, f, g] {
                if let Value::Object(o) = part {
                    m.extend(o);
                }
            }
            Value::Object(m)
        })
        .boxed()
}

/// A request id or progress token: ours (1 to 3, as a number or as
/// text), or anything.
pub fn id() -> BoxedStrategy<Value> {
    prop_oneof![
        (1u64..4).prop_map(Value::from),
        (1u64..4).prop_map(|n| Value::from(n.to_string())),
        Just(Value::Null),
        json(),
    ]
    .boxed()
}

/// A JSON-RPC message as an upstream may send it: a response (to us or
/// not), an error, a notification, a request of its own.
pub fn message() -> BoxedStrategy<Value> {
    let method = word(&[
        "notifications/progress",
        "notifications/message",
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
        "notifications/unknown",
        "ping",
        "elicitation/create",
    ]);
    let params = object(vec![
        ("progressToken", id()),
        ("progress", or_any(number())),
        ("total", or_any(number())),
        ("message", text()),
        ("level", text()),
        ("logger", text()),
        ("data", json()),
    ]);
    let error = object(vec![
        ("code", or_any(number())),
        ("message", text()),
        ("data", object(vec![("uri", text())])),
    ]);
    object(vec![
        ("jsonrpc", word(&["2.0"])),
        ("id", id()),
        ("method", method),
        ("params", or_any(params)),
        ("result", json()),
        ("error", or_any(error)),
    ])
}

/// A message, a batch of them, or anything.
pub fn message_or_batch() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => message(),
        1 => prop::collection::vec(message(), 0..5).prop_map(Value::Array),
        1 => json(),
    ]
    .boxed()
}

/// How a body arrives: reads ending at arbitrary points, or reads of a
/// few bytes each (0 to 3, in turn), which put every boundary next to
/// every other (a CR, then an LF alone, then …). A read of no bytes is
/// a repeated cut.
#[derive(Debug, Clone)]
pub enum Reads {
    At(Vec<prop::sample::Index>),
    Sizes(Vec<usize>),
}

pub fn reads() -> BoxedStrategy<Reads> {
    prop_oneof![
        prop::collection::vec(any::<prop::sample::Index>(), 0..12).prop_map(Reads::At),
        prop::collection::vec(0usize..4, 1..16).prop_map(Reads::Sizes),
    ]
    .boxed()
}

impl Reads {
    /// The cut points in a body of `len` bytes, sorted.
    pub fn cuts(&self, len: usize) -> Vec<usize> {
        match self {
            Reads::At(picks) => {
                let mut at: Vec<usize> = picks.iter().map(|i| i.index(len + 1)).collect();
                at.sort_unstable();
                at
            }
            Reads::Sizes(sizes) if sizes.iter().sum::<usize>() > 0 => {
                let mut at = Vec::new();
                let mut pos = 0;
                for size in sizes.iter().cycle() {
                    if pos >= len {
                        break;
                    }
                    pos = (pos + size).min(len);
                    at.push(pos);
                }
                at
            }
            Reads::Sizes(_) => Vec::new(),
        }
    }

    /// `bytes` in reads.
    pub fn split(&self, bytes: &[u8]) -> Vec<Vec<u8>> {
        chunks(bytes, &self.cuts(bytes.len()))
    }
}

/// `bytes` cut at `at` (sorted) into chunks.
pub fn chunks(bytes: &[u8], at: &[usize]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in at {
        out.push(bytes[from..cut].to_vec());
        from = cut;
    }
    out.push(bytes[from..].to_vec());
    out
}
