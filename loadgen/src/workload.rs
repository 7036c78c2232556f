//! What each request is: one tool call (`--tool`/`--args`) or a weighted mix
//! read from a TOML workload file, with argument templates.
//!
//! A workload file:
//!
//! ```toml
//! [[op]]
//! kind = "tool"              # tool | resource | prompt | list | ping
//! name = "echo"
//! weight = 8                 # relative; default 1
//! # Each argument is literal JSON (any TOML value) or a template table
//! # with a `random` key:
//! #   { random = "string", len = [16, 256] }   a string of random length
//! #   { random = "key", prefix = "k-", count = 1000 }   "k-0" .. "k-999"
//! #   { random = "int", range = [0, 100] }
//! args = { text = { random = "string", len = [16, 256] }, mode = "fast" }
//!
//! [[op]]
//! kind = "resource"
//! uri = "kv://item/{key}"     # `{key}` is filled from `key` below
//! key = { prefix = "k-", count = 1000 }
//!
//! [[op]]
//! kind = "prompt"
//! name = "summarise"
//! args = { topic = "\"rust\"" }
//!
//! [[op]]
//! kind = "list"
//! list = "tools"             # tools | resources | resource_templates | prompts
//! ```
//!
//! # Invariants
//! - Everything that can be decided once is decided at load time: literal
//!   arguments are JSON text already, templates only pick lengths and
//!   numbers per request, into buffers reused across requests.
//! - A literal table whose keys include `random` is a template; say so in
//!   the error when the template is malformed.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use mcp_schema::client::{Listing, RequestEncoder, RequestHeader};
use mcp_schema::fb::protocol::ResponsePayload;
use serde::Deserialize;

use crate::rng::Rng;

/// Characters random strings are drawn from: JSON-safe without escaping.
const ALPHABET: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";

/// Upper bound on a random string's length: far above any realistic
/// argument, below the broker's default 4 MiB frame limit.
const MAX_RANDOM_LEN: u64 = 1 << 20;

#[derive(Clone, Debug)]
pub enum ArgValue {
    /// JSON text, sent as is.
    Literal(String),
    RandomString {
        min: u64,
        max: u64,
    },
    RandomKey {
        prefix: String,
        count: u64,
    },
    RandomInt {
        min: i64,
        max: i64,
    },
}

#[derive(Clone, Debug)]
pub struct Arg {
    pub key: String,
    pub value: ArgValue,
}

#[derive(Clone, Debug)]
pub struct KeySpec {
    pub prefix: String,
    pub count: u64,
}

#[derive(Clone, Debug)]
pub enum Op {
    Tool { name: String, args: Vec<Arg> },
    Resource { uri: String, key: Option<KeySpec> },
    Prompt { name: String, args: Vec<Arg> },
    List(Listing),
    Ping,
}

impl Op {
    /// The final response payload a successful answer must have.
    pub fn expected(&self) -> ResponsePayload {
        match self {
            Op::Tool { .. } => ResponsePayload::ToolResult,
            Op::Resource { .. } => ResponsePayload::ResourceData,
            Op::Prompt { .. } => ResponsePayload::AppliedPrompt,
            Op::List(Listing::Tools) => ResponsePayload::ListToolsResult,
            Op::List(Listing::Resources) => ResponsePayload::ListResourcesResult,
            Op::List(Listing::ResourceTemplates) => ResponsePayload::ListResourceTemplatesResult,
            Op::List(Listing::Prompts) => ResponsePayload::ListPromptsResult,
            Op::Ping => ResponsePayload::PingResponse,
        }
    }

    fn describe(&self) -> String {
        match self {
            Op::Tool { name, .. } => format!("tool {name}"),
            Op::Resource { uri, .. } => format!("resource {uri}"),
            Op::Prompt { name, .. } => format!("prompt {name}"),
            Op::List(l) => format!("list {l:?}"),
            Op::Ping => "ping".into(),
        }
    }
}

/// A weighted set of operations; immutable once built and shared by all
/// worker threads.
#[derive(Clone, Debug)]
pub struct Workload {
    ops: Vec<Op>,
    /// Cumulative weights, same order as `ops`.
    cumulative: Vec<u64>,
}

impl Workload {
    pub fn single(op: Op) -> Self {
        Self {
            ops: vec![op],
            cumulative: vec![1],
        }
    }

    /// `--tool NAME --args JSON`: each top-level member of the object
    /// becomes one argument whose value is that member's JSON text.
    pub fn tool(name: &str, args_json: &str) -> anyhow::Result<Self> {
        let v: serde_json::Value = serde_json::from_str(args_json)
            .with_context(|| format!("--args is not valid JSON: {args_json}"))?;
        let serde_json::Value::Object(map) = v else {
            bail!("--args must be a JSON object, like '{{\"text\":\"hello\"}}'");
        };
        let args = map
            .into_iter()
            .map(|(key, value)| Arg {
                key,
                value: ArgValue::Literal(value.to_string()),
            })
            .collect();
        Ok(Self::single(Op::Tool {
            name: name.to_owned(),
            args,
        }))
    }

    pub fn from_toml(text: &str) -> anyhow::Result<Self> {
        let file: File = toml::from_str(text)?;
        if file.op.is_empty() {
            bail!("the workload has no [[op]] entries");
        }
        let mut ops = Vec::new();
        let mut cumulative = Vec::new();
        let mut total = 0u64;
        let mut problems = Vec::new();
        for (i, f) in file.op.into_iter().enumerate() {
            let weight = f.weight.unwrap_or(1);
            match f.into_op() {
                Ok(op) if weight > 0 => {
                    total += weight;
                    ops.push(op);
                    cumulative.push(total);
                }
                Ok(_) => {}
                Err(e) => problems.push(format!("op[{i}]: {e}")),
            }
        }
        if !problems.is_empty() {
            bail!("{}", problems.join("\n"));
        }
        if ops.is_empty() {
            bail!("every op has weight 0");
        }
        Ok(Self { ops, cumulative })
    }

    pub fn describe(&self) -> String {
        self.ops
            .iter()
            .map(Op::describe)
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn pick(&self, rng: &mut Rng) -> &Op {
        &self.ops[self.pick_index(rng)]
    }

    /// The index in `ops` of the next op, drawn by weight.
    fn pick_index(&self, rng: &mut Rng) -> usize {
        if self.ops.len() == 1 {
            return 0;
        }
        let total = *self.cumulative.last().unwrap_or(&1);
        let x = rng.below(total);
        let i = self.cumulative.partition_point(|&c| c <= x);
        i.min(self.ops.len() - 1)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    op: Vec<FileOp>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileOp {
    kind: String,
    name: Option<String>,
    uri: Option<String>,
    list: Option<String>,
    weight: Option<u64>,
    args: Option<BTreeMap<String, toml::Value>>,
    key: Option<FileKey>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileKey {
    #[serde(default)]
    prefix: String,
    count: u64,
}

impl FileOp {
    fn into_op(self) -> Result<Op, String> {
        let need = |v: Option<String>, what: &str| {
            v.filter(|s| !s.is_empty())
                .ok_or_else(|| format!("kind = \"{}\" needs `{what}`", self.kind))
        };
        let args = || -> Result<Vec<Arg>, String> {
            self.args
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(key, v)| {
                    let value = arg_value(&v).map_err(|e| format!("args.{key}: {e}"))?;
                    Ok(Arg { key, value })
                })
                .collect()
        };
        Ok(match self.kind.as_str() {
            "tool" => Op::Tool {
                name: need(self.name.clone(), "name")?,
                args: args()?,
            },
            "prompt" => {
                let args = args()?;
                // MCP's prompt arguments are strings: a server (the broker
                // included) refuses a number with -32602.
                if let Some(a) = args.iter().find(|a| match &a.value {
                    ArgValue::Literal(json) => !json.starts_with('"'),
                    ArgValue::RandomInt { .. } => true,
                    ArgValue::RandomString { .. } | ArgValue::RandomKey { .. } => false,
                }) {
                    return Err(format!(
                        "args.{}: a prompt's arguments are strings (a string, or a random string or key)",
                        a.key
                    ));
                }
                Op::Prompt {
                    name: need(self.name.clone(), "name")?,
                    args,
                }
            }
            "resource" => {
                let uri = need(self.uri.clone(), "uri")?;
                let key = match &self.key {
                    Some(k) if k.count == 0 => return Err("key.count must be > 0".into()),
                    Some(k) => Some(KeySpec {
                        prefix: k.prefix.clone(),
                        count: k.count,
                    }),
                    None => None,
                };
                if key.is_some() != uri.contains("{key}") {
                    return Err("`key` and a `{key}` placeholder in `uri` go together".into());
                }
                Op::Resource { uri, key }
            }
            "list" => Op::List(match self.list.as_deref() {
                Some("tools") => Listing::Tools,
                Some("resources") => Listing::Resources,
                Some("resource_templates") => Listing::ResourceTemplates,
                Some("prompts") => Listing::Prompts,
                Some(other) => {
                    return Err(format!(
                        "list = {other:?}: expected tools, resources, resource_templates or prompts"
                    ));
                }
                None => {
                    return Err("`list` is missing: expected tools, resources, \
                                resource_templates or prompts"
                        .into());
                }
            }),
            "ping" => Op::Ping,
            other => {
                return Err(format!(
                    "unknown kind `{other}` (expected tool, resource, prompt, list or ping)"
                ));
            }
        })
    }
}

fn pair(v: Option<&toml::Value>, what: &str) -> Result<(i64, i64), String> {
    let Some(toml::Value::Array(a)) = v else {
        return Err(format!("needs `{what} = [MIN, MAX]`"));
    };
    match a.as_slice() {
        [toml::Value::Integer(lo), toml::Value::Integer(hi)] if lo <= hi => Ok((*lo, *hi)),
        _ => Err(format!(
            "`{what}` must be [MIN, MAX] integers with MIN <= MAX"
        )),
    }
}

fn arg_value(v: &toml::Value) -> Result<ArgValue, String> {
    let toml::Value::Table(t) = v else {
        return serde_json::to_string(v)
            .map(ArgValue::Literal)
            .map_err(|e| e.to_string());
    };
    let Some(kind) = t.get("random") else {
        return serde_json::to_string(v)
            .map(ArgValue::Literal)
            .map_err(|e| e.to_string());
    };
    match kind.as_str() {
        Some("string") => {
            let (min, max) = pair(t.get("len"), "len")?;
            if min < 0 || max as u64 > MAX_RANDOM_LEN {
                return Err(format!("len must lie within 0..={MAX_RANDOM_LEN}"));
            }
            Ok(ArgValue::RandomString {
                min: min as u64,
                max: max as u64,
            })
        }
        Some("key") => {
            let count = t
                .get("count")
                .and_then(toml::Value::as_integer)
                .filter(|c| *c > 0)
                .ok_or("a random key needs `count` > 0")?;
            let prefix = t
                .get("prefix")
                .and_then(toml::Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if prefix.contains(['"', '\\']) || prefix.chars().any(char::is_control) {
                return Err("the key prefix must not need JSON escaping".into());
            }
            Ok(ArgValue::RandomKey {
                prefix,
                count: count as u64,
            })
        }
        Some("int") => {
            let (min, max) = pair(t.get("range"), "range")?;
            Ok(ArgValue::RandomInt { min, max })
        }
        _ => Err("`random` must be \"string\", \"key\" or \"int\" (a template table)".into()),
    }
}

/// Per-connection request builder: picks an op, fills its templates and
/// encodes the frame. Owns every buffer it uses, so that steady-state
/// generation allocates nothing.
pub struct Generator {
    wl: std::sync::Arc<Workload>,
    rng: Rng,
    enc: RequestEncoder,
    /// One JSON text per argument of the op being built.
    values: Vec<String>,
    /// The allocation of the `(key, value)` slice handed to the encoder,
    /// recycled between requests (see [`recycle`]).
    pairs: Vec<(&'static str, &'static str)>,
    uri: String,
    /// The JSON object text of the arguments (`next_json`), reused.
    json: Vec<u8>,
    /// A block of random characters; random strings are slices of it.
    noise: Vec<u8>,
    /// The last tool call frame built, for the next one to patch instead
    /// of building (see [`Template`]).
    template: Option<Template>,
}

/// A tool call frame whose arguments are all literal, kept with the
/// positions of the fields that change from one request to the next.
///
/// At high rates building each frame was 15% of the generator's CPU (the
/// FlatBuffers builder writes and deduplicates a vtable per table). The
/// frames of one op differ only in the message id, the tool call id, the
/// two timestamps and the correlation id's digits; the builder lays out
/// equal inputs identically, and its layout depends on lengths and on which
/// fields are present, never on the values of fixed-size fields. So a frame
/// built for the same op, header shape and correlation id length is this
/// one with those bytes replaced, which the tests check byte for byte.
struct Template {
    op: usize,
    frame: Vec<u8>,
    /// What the layout depends on besides the op.
    corr_len: Option<usize>,
    session: Option<String>,
    timeout_ms: u32,
    /// Byte offsets in `frame`.
    message_id: usize,
    tool_call_id: usize,
    header_nanos: usize,
    call_nanos: usize,
    corr: usize,
}

impl Template {
    /// Records where the changing fields of `frame` (a tool call built
    /// from `h`) lie. `None` if the frame does not read back as one, which
    /// a frame the encoder just built always does.
    fn new(op: usize, frame: &[u8], h: &RequestHeader<'_>) -> Option<Template> {
        use mcp_schema::fb::protocol::Request;
        let req = mcp_schema::flatbuffers::size_prefixed_root::<Request>(frame).ok()?;
        let call = req.payload_as_tool_call()?;
        let header = req.header();
        let at = |p: *const u8| (p as usize).checked_sub(frame.as_ptr() as usize);
        let corr = match header.correlation_id() {
            Some(c) => at(c.as_ptr())?,
            None => 0,
        };
        Some(Template {
            op,
            corr_len: h.correlation_id.map(str::len),
            session: h.session_id.map(str::to_owned),
            timeout_ms: h.timeout_ms,
            message_id: at(header.message_id().bytes().as_ptr())?,
            tool_call_id: at(call.id().bytes().as_ptr())?,
            header_nanos: at(header.timestamp() as *const _ as *const u8)?,
            call_nanos: at(call.timestamp()? as *const _ as *const u8)?,
            corr,
            frame: frame.to_vec(),
        })
    }

    /// Whether a frame for `op` with header `h` has this one's layout.
    fn fits(&self, op: usize, h: &RequestHeader<'_>) -> bool {
        self.op == op
            && self.corr_len == h.correlation_id.map(str::len)
            && self.session.as_deref() == h.session_id
            && self.timeout_ms == h.timeout_ms
    }

    /// Appends the frame for `h` (which [`fits`](Self::fits)) to `out`.
    fn write(&mut self, h: &RequestHeader<'_>, out: &mut Vec<u8>) {
        let f = &mut self.frame;
        f[self.message_id..self.message_id + 16].copy_from_slice(&h.message_id);
        f[self.tool_call_id..self.tool_call_id + 16].copy_from_slice(&h.message_id);
        let nanos = h.unix_nanos.to_le_bytes();
        f[self.header_nanos..self.header_nanos + 8].copy_from_slice(&nanos);
        f[self.call_nanos..self.call_nanos + 8].copy_from_slice(&nanos);
        if let Some(c) = h.correlation_id {
            f[self.corr..self.corr + c.len()].copy_from_slice(c.as_bytes());
        }
        out.extend_from_slice(f);
    }
}

/// The next request for a driver that builds its own messages (gRPC):
/// templates filled, tool and prompt arguments as one JSON object.
#[derive(Debug)]
pub enum Next<'a> {
    Tool { name: &'a str, args: &'a [u8] },
    Prompt { name: &'a str, args: &'a [u8] },
    Resource { uri: &'a str },
    List(Listing),
    Ping,
}

/// Reuses a vector's allocation for borrows of a different lifetime. The
/// vector is emptied first, so no element is converted; `collect` on a
/// `vec::IntoIter` of a same-layout type reuses the buffer in place.
fn recycle<'a, 'b>(mut v: Vec<(&'a str, &'a str)>) -> Vec<(&'b str, &'b str)> {
    v.clear();
    v.into_iter().map(|_| ("", "")).collect()
}

impl Generator {
    pub fn new(wl: std::sync::Arc<Workload>, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let longest = wl
            .ops
            .iter()
            .flat_map(|op| match op {
                Op::Tool { args, .. } | Op::Prompt { args, .. } => args.as_slice(),
                _ => &[],
            })
            .map(|a| match a.value {
                ArgValue::RandomString { max, .. } => max,
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        // Twice the longest string, so a random offset still leaves room.
        let noise = (0..longest * 2)
            .map(|_| ALPHABET[rng.below(64) as usize])
            .collect();
        Self {
            wl,
            rng,
            enc: RequestEncoder::new(),
            values: Vec::new(),
            pairs: Vec::new(),
            uri: String::new(),
            json: Vec::new(),
            noise,
            template: None,
        }
    }

    /// Encodes the next request with header `h` onto the end of `out` and
    /// returns the response payload expected for it.
    pub fn encode(&mut self, h: &RequestHeader<'_>, out: &mut Vec<u8>) -> ResponsePayload {
        let wl = std::sync::Arc::clone(&self.wl);
        let index = wl.pick_index(&mut self.rng);
        let op = &wl.ops[index];
        // A tool call with literal arguments is the same frame every time
        // but for the header's fields: patch the last one (see `Template`).
        let literal = matches!(op, Op::Tool { args, .. }
            if args.iter().all(|a| matches!(a.value, ArgValue::Literal(_))));
        if literal && let Some(t) = self.template.as_mut().filter(|t| t.fits(index, h)) {
            t.write(h, out);
            return op.expected();
        }
        match op {
            Op::Tool { name, args } | Op::Prompt { name, args } => {
                fill(&mut self.rng, &self.noise, &mut self.values, args);
                let mut pairs = recycle(std::mem::take(&mut self.pairs));
                pairs.extend(
                    args.iter()
                        .zip(&self.values)
                        .map(|(a, v)| (a.key.as_str(), v.as_str())),
                );
                let frame = if matches!(op, Op::Tool { .. }) {
                    self.enc.tool_call(h, h.message_id, name, &pairs)
                } else {
                    self.enc.get_prompt(h, name, &pairs)
                };
                out.extend_from_slice(frame);
                if literal {
                    self.template = Template::new(index, frame, h);
                }
                self.pairs = recycle(pairs);
            }
            Op::Resource { uri, key } => {
                let uri = resolve_uri(&mut self.rng, &mut self.uri, uri, key.as_ref());
                out.extend_from_slice(self.enc.read_resource(h, uri));
            }
            Op::List(what) => out.extend_from_slice(self.enc.list(h, *what, None)),
            Op::Ping => out.extend_from_slice(self.enc.ping(h)),
        }
        op.expected()
    }

    /// Picks the next op and fills its templates, for drivers that build
    /// their own messages (the same choices, for the same seed, as
    /// [`Generator::encode`]).
    pub fn next_json(&mut self) -> (Next<'_>, ResponsePayload) {
        let Self {
            wl,
            rng,
            values,
            uri: uri_buf,
            json,
            noise,
            ..
        } = self;
        let op = wl.pick(rng);
        let next = match op {
            Op::Tool { name, args } | Op::Prompt { name, args } => {
                fill(rng, noise, values, args);
                json.clear();
                json.push(b'{');
                for (i, (a, v)) in args.iter().zip(values.iter()).enumerate() {
                    if i > 0 {
                        json.push(b',');
                    }
                    // A string always serialises.
                    let _ = serde_json::to_writer(&mut *json, &a.key);
                    json.push(b':');
                    json.extend_from_slice(v.as_bytes());
                }
                json.push(b'}');
                if matches!(op, Op::Tool { .. }) {
                    Next::Tool { name, args: json }
                } else {
                    Next::Prompt { name, args: json }
                }
            }
            Op::Resource { uri, key } => Next::Resource {
                uri: resolve_uri(rng, uri_buf, uri, key.as_ref()),
            },
            Op::List(what) => Next::List(*what),
            Op::Ping => Next::Ping,
        };
        (next, op.expected())
    }
}

/// A resource op's URI: `uri` itself, or with `{key}` filled into `buf`.
fn resolve_uri<'a>(
    rng: &mut Rng,
    buf: &'a mut String,
    uri: &'a str,
    key: Option<&KeySpec>,
) -> &'a str {
    let Some(k) = key else {
        return uri;
    };
    use std::fmt::Write;
    buf.clear();
    let n = rng.below(k.count);
    let (head, tail) = uri.split_once("{key}").unwrap_or((uri, ""));
    let _ = write!(buf, "{head}{}{n}{tail}", k.prefix);
    buf.as_str()
}

/// Writes the JSON text of each argument into `values`.
fn fill(rng: &mut Rng, noise: &[u8], values: &mut Vec<String>, args: &[Arg]) {
    use std::fmt::Write;
    if values.len() < args.len() {
        values.resize_with(args.len(), String::new);
    }
    for (a, v) in args.iter().zip(values.iter_mut()) {
        v.clear();
        match &a.value {
            ArgValue::Literal(s) => v.push_str(s),
            ArgValue::RandomString { min, max } => {
                let len = rng.range(*min, *max) as usize;
                let start = rng.below((noise.len() - len + 1) as u64) as usize;
                v.push('"');
                // The noise is ASCII from ALPHABET.
                v.push_str(std::str::from_utf8(&noise[start..start + len]).unwrap_or(""));
                v.push('"');
            }
            ArgValue::RandomKey { prefix, count } => {
                let _ = write!(v, "\"{prefix}{}\"", rng.below(*count));
            }
            ArgValue::RandomInt { min, max } => {
                let span = max.abs_diff(*min);
                let n = min.wrapping_add(rng.range(0, span) as i64);
                let _ = write!(v, "{n}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_schema::fb::protocol::{Request, RequestPayload};
    use mcp_schema::flatbuffers;

    fn decode(frame: &[u8]) -> Request<'_> {
        flatbuffers::size_prefixed_root::<Request>(frame).unwrap()
    }

    #[test]
    fn args_json_members_become_key_values_of_json_text() {
        let wl = std::sync::Arc::new(
            Workload::tool("echo", r#"{"text":"hello","n":3,"o":{"a":[1]}}"#).unwrap(),
        );
        let mut g = Generator::new(wl, 1);
        let mut out = Vec::new();
        let h = RequestHeader {
            correlation_id: Some("c1"),
            ..Default::default()
        };
        assert_eq!(g.encode(&h, &mut out), ResponsePayload::ToolResult);
        let tc = decode(&out).payload_as_tool_call().unwrap();
        assert_eq!(tc.tool_name(), "echo");
        let kv: Vec<_> = tc
            .arguments()
            .iter()
            .map(|kv| (kv.key().to_owned(), kv.value().unwrap().to_owned()))
            .collect();
        assert_eq!(
            kv,
            [
                ("n".into(), "3".into()),
                ("o".into(), r#"{"a":[1]}"#.into()),
                ("text".into(), r#""hello""#.into())
            ]
        );
    }

    /// A patched template must be exactly the frame the encoder builds:
    /// across correlation id lengths (9 -> 10 digits), sessions, timeouts,
    /// a missing correlation id, and ops that alternate with other ops.
    #[test]
    fn patched_tool_call_frames_equal_freshly_built_ones() {
        let wl = std::sync::Arc::new(
            Workload::tool("echo", r#"{"text":"hello","n":3,"o":{"a":[1]}}"#).unwrap(),
        );
        let mixed = std::sync::Arc::new(
            Workload::from_toml(
                r#"
                [[op]]
                kind = "tool"
                name = "echo"
                args = { text = "hi" }
                [[op]]
                kind = "tool"
                name = "put"
                args = { key = { random = "key", prefix = "k", count = 10 } }
                [[op]]
                kind = "ping"
                [[op]]
                kind = "tool"
                name = "sum"
                args = { a = 1, b = 2 }
                "#,
            )
            .unwrap(),
        );
        for wl in [wl, mixed] {
            let mut g = Generator::new(wl.clone(), 7);
            // The same draws, built from scratch every time.
            let mut fresh = Generator::new(wl, 7);
            let mut enc = RequestEncoder::new();
            let mut seen_patched = 0;
            for seq in 999_999_990u64..1_000_000_030 {
                let corr = format!("l3.{seq}");
                let mut id = [0u8; 16];
                id[8..].copy_from_slice(&seq.to_be_bytes());
                let h = RequestHeader {
                    message_id: id,
                    correlation_id: (seq % 17 != 0).then_some(corr.as_str()),
                    session_id: (seq % 11 == 0).then_some("s-1"),
                    timeout_ms: if seq % 13 == 0 { 250 } else { 0 },
                    unix_nanos: 1_700_000_000_000_000_000 + seq as i64 * 977,
                };
                let mut out = Vec::new();
                let expect = g.encode(&h, &mut out);
                let index = fresh.wl.pick_index(&mut fresh.rng);
                let want: Vec<u8> = match &fresh.wl.ops[index] {
                    Op::Tool { name, args } => {
                        fill(&mut fresh.rng, &fresh.noise, &mut fresh.values, args);
                        let pairs: Vec<(&str, &str)> = args
                            .iter()
                            .zip(&fresh.values)
                            .map(|(a, v)| (a.key.as_str(), v.as_str()))
                            .collect();
                        enc.tool_call(&h, h.message_id, name, &pairs).to_vec()
                    }
                    Op::Ping => enc.ping(&h).to_vec(),
                    other => panic!("not in these workloads: {other:?}"),
                };
                assert_eq!(out, want, "frame for seq {seq} (op {index})");
                assert_eq!(expect, fresh.wl.ops[index].expected());
                if g.template.as_ref().is_some_and(|t| t.fits(index, &h)) {
                    seen_patched += 1;
                }
            }
            assert!(seen_patched > 5, "the template was used ({seen_patched})");
        }
    }

    #[test]
    fn next_json_builds_one_json_object_of_the_arguments() {
        let wl = std::sync::Arc::new(
            Workload::tool("echo", r#"{"text":"hello","n":3,"q\"k":null}"#).unwrap(),
        );
        let mut g = Generator::new(wl, 1);
        let (next, expect) = g.next_json();
        assert_eq!(expect, ResponsePayload::ToolResult);
        let Next::Tool { name, args } = next else {
            panic!("{next:?}")
        };
        assert_eq!(name, "echo");
        let v: serde_json::Value = serde_json::from_slice(args).unwrap();
        assert_eq!(v, serde_json::json!({"text":"hello","n":3,"q\"k":null}));
        let wl = std::sync::Arc::new(Workload::tool("ping_me", "{}").unwrap());
        let mut g = Generator::new(wl, 1);
        let (next, _) = g.next_json();
        assert!(matches!(next, Next::Tool { args: b"{}", .. }), "{next:?}");
    }

    #[test]
    fn args_must_be_an_object() {
        assert!(Workload::tool("echo", "[1]").is_err());
        assert!(Workload::tool("echo", "{").is_err());
    }

    #[test]
    fn workload_file_mixes_ops_by_weight_and_fills_templates() {
        let wl = Workload::from_toml(
            r#"
            [[op]]
            kind = "tool"
            name = "echo"
            weight = 3
            args = { text = { random = "string", len = [4, 8] }, k = { random = "key", prefix = "u", count = 5 }, n = { random = "int", range = [-2, 2] }, lit = { a = 1 } }
            [[op]]
            kind = "resource"
            uri = "kv://item/{key}"
            key = { prefix = "k", count = 10 }
            [[op]]
            kind = "list"
            list = "prompts"
            weight = 0
            "#,
        )
        .unwrap();
        let mut g = Generator::new(std::sync::Arc::new(wl), 3);
        let (mut tools, mut resources) = (0, 0);
        for _ in 0..400 {
            let mut out = Vec::new();
            g.encode(&RequestHeader::default(), &mut out);
            let r = decode(&out);
            match r.payload_type() {
                RequestPayload::ToolCall => {
                    tools += 1;
                    let tc = r.payload_as_tool_call().unwrap();
                    let args: BTreeMap<_, _> = tc
                        .arguments()
                        .iter()
                        .map(|kv| (kv.key().to_owned(), kv.value().unwrap().to_owned()))
                        .collect();
                    let text: String = serde_json::from_str(&args["text"]).unwrap();
                    assert!((4..=8).contains(&text.len()));
                    let k: String = serde_json::from_str(&args["k"]).unwrap();
                    assert!(k.starts_with('u'));
                    let n: i64 = args["n"].parse().unwrap();
                    assert!((-2..=2).contains(&n));
                    assert_eq!(args["lit"], r#"{"a":1}"#);
                }
                RequestPayload::ResourceRequest => {
                    resources += 1;
                    let uri = r.payload_as_resource_request().unwrap().uri();
                    assert!(uri.starts_with("kv://item/k"), "{uri}");
                }
                t => panic!("unexpected {t:?}"),
            }
        }
        assert!(tools > 240 && resources > 60, "{tools} {resources}");
    }

    #[test]
    fn workload_errors_are_all_reported() {
        let e = Workload::from_toml(
            r#"
            [[op]]
            kind = "tool"
            [[op]]
            kind = "teleport"
            [[op]]
            kind = "tool"
            name = "x"
            args = { t = { random = "string" } }
            [[op]]
            kind = "prompt"
            name = "p"
            args = { s = "x", k = { random = "key", count = 2 }, n = 3 }
            [[op]]
            kind = "prompt"
            name = "p"
            args = { i = { random = "int", range = [0, 9] } }
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("op[0]") && e.contains("needs `name`"), "{e}");
        assert!(e.contains("op[1]") && e.contains("unknown kind"), "{e}");
        assert!(e.contains("op[2]") && e.contains("args.t"), "{e}");
        assert!(
            e.contains("op[3]: args.n: a prompt's arguments are strings"),
            "{e}"
        );
        assert!(
            e.contains("op[4]: args.i: a prompt's arguments are strings"),
            "{e}"
        );
    }
}
