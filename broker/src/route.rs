//! The route table: which router serves a tool, resource or prompt.
//!
//! Built once from the routers' cached metadata and then immutable: shards
//! share it read-only through an `Arc`, and a change of routers means a new
//! table swapped in whole, never an edit in place, so lookups take no lock.
//!
//! # Naming
//! A tool or prompt name offered by one router is served as it is. A name
//! offered by several routers is served by each of them as
//! `<prefix><separator><name>` (prefix: the router's configured `prefix`,
//! else its name; separator: `naming.separator`, default `__`), and the bare
//! name is not served. A qualified name that still collides (with another
//! qualified name or with a bare one) is a start-up error naming both
//! routers.
//!
//! # Resources
//! A URI is routed by, in order: an exact match with a listed resource; the
//! longest literal prefix of a listed URI template (a listed URI holding
//! `{`, RFC 6570); its scheme, when exactly one router lists URIs of that
//! scheme; finally a scheme equal to a router's name (`kv://x` → router
//! `kv`), so a stateful router that lists nothing at start-up still serves
//! the URIs it creates later.

use std::collections::HashMap;
use std::sync::Arc;

use crate::wasm::RouterMeta;
use crate::wasm::types::{McpResource, Prompt, Tool};

/// Index of a router in the broker's router list.
pub type RouterId = u16;

/// Where a name goes: the router and the name the router knows it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub router: RouterId,
    pub name: Box<str>,
    /// Its entry in the listing (`tool_list` or `prompt_list`): what a
    /// lookup by name needs besides the route (a tool's input schema).
    pub listed: usize,
}

/// One router as the table sees it.
#[derive(Debug, Clone)]
pub struct RouterEntry {
    pub name: String,
    pub prefix: Option<String>,
    pub meta: Arc<RouterMeta>,
}

/// A listed item with the name it is served under.
#[derive(Debug, Clone)]
pub struct Listed<T> {
    pub router: RouterId,
    pub exposed: Box<str>,
    pub item: T,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error(
        "{kind} name `{name}` is served by both router `{a}` and router `{b}` even after qualification; give one of them a distinct `prefix`"
    )]
    Collision {
        kind: &'static str,
        name: String,
        a: String,
        b: String,
    },
    #[error("too many routers ({0}); at most {max}", max = RouterId::MAX)]
    TooManyRouters(usize),
}

/// The route tables' maps by name. Their keys come from the routers'
/// listings, never from clients, who only look names up; so foldhash
/// (seeded per process) rather than SipHash, a fraction of its cost on a
/// tool name, which each call hashes two or three times (routing, then
/// its metrics).
pub type Names<V> = foldhash::HashMap<Box<str>, V>;

/// The immutable routing state.
#[derive(Debug, Default)]
pub struct RouteTable {
    routers: Vec<String>,
    tools: Names<Target>,
    prompts: Names<Target>,
    /// exact URI → (router, index in `resource_list`).
    resources: Names<(RouterId, usize)>,
    /// (literal prefix, router), longest prefix first.
    templates: Vec<(Box<str>, RouterId)>,
    /// scheme → router, for schemes exactly one router lists.
    schemes: Names<RouterId>,
    pub tool_list: Vec<Listed<Tool>>,
    pub prompt_list: Vec<Listed<Prompt>>,
    pub resource_list: Vec<Listed<McpResource>>,
    pub template_list: Vec<Listed<McpResource>>,
    /// Listed items this table does not serve, each worded for the log:
    /// a resource URI (or template) another router, listed first, serves
    /// (a prefix never applies to a URI), and a name or URI a router lists
    /// twice (its first entry is served).
    pub shadowed: Vec<String>,
}

fn scheme(uri: &str) -> Option<&str> {
    uri.split_once("://")
        .map(|(s, _)| s)
        .filter(|s| !s.is_empty())
}

/// A listed resource URI holding an RFC 6570 expression is a template.
pub fn is_template(uri: &str) -> bool {
    uri.contains('{')
}

impl RouteTable {
    pub fn build(entries: &[RouterEntry], separator: &str) -> Result<Self, RouteError> {
        if entries.len() > RouterId::MAX as usize {
            return Err(RouteError::TooManyRouters(entries.len()));
        }
        let mut t = RouteTable {
            routers: entries.iter().map(|e| e.name.clone()).collect(),
            ..Default::default()
        };
        let prefix = |i: usize| {
            entries[i]
                .prefix
                .clone()
                .unwrap_or_else(|| entries[i].name.clone())
        };

        // Tools and prompts: the same qualification rule.
        let tools: Vec<(usize, &Tool, &str)> = entries
            .iter()
            .enumerate()
            .flat_map(|(i, e)| e.meta.tools.iter().map(move |x| (i, x, x.name.as_str())))
            .collect();
        let tools = first_of_each(tools, "tool", &t.routers, &mut t.shadowed);
        let (map, mut list) = qualify("tool", &tools, &t.routers, &prefix, separator)?;
        for l in &mut list {
            if let Some(why) = header_declarations::strip_if_invalid(&mut l.item.input_schema) {
                t.shadowed.push(format!(
                    "router `{}` lists tool `{}` whose `x-mcp-header` declarations MCP 2026-07-28 calls invalid ({why}): it is served without them, so that clients of that revision, which must drop such a tool, can call it",
                    t.routers[l.router as usize], l.item.name,
                ));
            }
        }
        t.tools = map;
        t.tool_list = list;
        let prompts: Vec<(usize, &Prompt, &str)> = entries
            .iter()
            .enumerate()
            .flat_map(|(i, e)| e.meta.prompts.iter().map(move |x| (i, x, x.name.as_str())))
            .collect();
        let prompts = first_of_each(prompts, "prompt", &t.routers, &mut t.shadowed);
        let (map, list) = qualify("prompt", &prompts, &t.routers, &prefix, separator)?;
        t.prompts = map;
        t.prompt_list = list;

        // Resources: URIs are global names, which no prefix qualifies. The
        // same URI (or template) from two routers goes to the one listed
        // first; the other's entry is left out. Refusing the table instead
        // would refuse every listing of both routers, tools included, for
        // one URI two upstreams happen to share (two replicas, or two
        // instances of one server).
        let mut template_owner: HashMap<&str, RouterId> = HashMap::new();
        let mut scheme_owner: HashMap<&str, Option<RouterId>> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            let id = i as RouterId;
            for r in &e.meta.resources {
                if r.uri.is_empty() || unfit_text(&r.uri) {
                    t.shadowed.push(format!(
                        "router `{}` lists a resource whose URI is empty or holds control or invisible characters (`{}`); it is not served",
                        e.name, r.uri
                    ));
                    continue;
                }
                if let Some(s) = scheme(&r.uri) {
                    let owner = scheme_owner.entry(s).or_insert(Some(id));
                    if *owner != Some(id) {
                        *owner = None;
                    }
                }
                let listed = Listed {
                    router: id,
                    exposed: r.uri.clone().into(),
                    item: r.clone(),
                };
                // Who serves this URI already, if anyone.
                let served_by = if is_template(&r.uri) {
                    let first = template_owner.get(r.uri.as_str()).copied();
                    template_owner.entry(r.uri.as_str()).or_insert(id);
                    first
                } else {
                    t.resources.get(r.uri.as_str()).map(|&(o, _)| o)
                };
                if let Some(owner) = served_by {
                    t.shadowed.push(if owner == id {
                        format!(
                            "router `{}` lists resource `{}` twice; its first entry is served",
                            e.name, r.uri
                        )
                    } else {
                        format!(
                            "resource `{}` of router `{}` is not served: router `{}`, listed first, serves that URI (a prefix never applies to URIs)",
                            r.uri, e.name, t.routers[owner as usize]
                        )
                    });
                    continue;
                }
                if is_template(&r.uri) {
                    let literal = &r.uri[..r.uri.find('{').unwrap_or(r.uri.len())];
                    t.templates.push((literal.into(), id));
                    t.template_list.push(listed);
                } else {
                    t.resources
                        .insert(r.uri.clone().into(), (id, t.resource_list.len()));
                    t.resource_list.push(listed);
                }
            }
        }
        t.templates
            .sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        t.schemes = scheme_owner
            .into_iter()
            .filter_map(|(s, o)| o.map(|o| (Box::<str>::from(s), o)))
            .collect();
        Ok(t)
    }

    pub fn router_names(&self) -> &[String] {
        &self.routers
    }

    pub fn tool(&self, name: &str) -> Option<&Target> {
        self.tools.get(name)
    }

    /// The listing entry of tool `name` (its schema), without a scan.
    pub fn listed_tool(&self, name: &str) -> Option<&Listed<Tool>> {
        self.tools.get(name).map(|t| &self.tool_list[t.listed])
    }

    pub fn prompt(&self, name: &str) -> Option<&Target> {
        self.prompts.get(name)
    }

    /// The listed (non-template) resource with exactly this URI, whose
    /// metadata a read's answer carries.
    pub fn listed_resource(&self, uri: &str) -> Option<&McpResource> {
        self.resources
            .get(uri)
            .map(|&(_, i)| &self.resource_list[i].item)
    }

    pub fn resource(&self, uri: &str) -> Option<RouterId> {
        if let Some(&(r, _)) = self.resources.get(uri) {
            return Some(r);
        }
        if let Some((_, r)) = self
            .templates
            .iter()
            .find(|(p, _)| !p.is_empty() && uri.starts_with(&**p))
        {
            return Some(*r);
        }
        let s = scheme(uri)?;
        self.schemes.get(s).copied().or_else(|| {
            self.routers
                .iter()
                .position(|r| r == s)
                .map(|i| i as RouterId)
        })
    }
}

type Qualified<T> = (Names<Target>, Vec<Listed<T>>);

/// `items` without a router's second entry of a name it already listed
/// (noted in `shadowed`): such a router's names would otherwise count as
/// a collision with itself, qualified with one prefix into the same name.
/// Nor a name that is empty or holds a control or invisible character
/// ([`unfit_text`]; an upstream's listing is not ours to trust): no client
/// can call it as meant, a newline in it would be a line of its own in
/// every client's log, and a bidi override shows an approval dialog
/// another name than the one called.
fn first_of_each<'a, T>(
    items: Vec<(usize, &'a T, &'a str)>,
    kind: &str,
    routers: &[String],
    shadowed: &mut Vec<String>,
) -> Vec<(usize, &'a T, &'a str)> {
    let mut seen: std::collections::HashSet<(usize, &str)> = Default::default();
    items
        .into_iter()
        .filter(|&(i, _, name)| {
            if name.is_empty() || unfit_text(name) {
                // Raw: the note is escaped where it is logged.
                shadowed.push(format!(
                    "router `{}` lists a {kind} whose name is empty or holds control or invisible characters (`{name}`); it is not served",
                    routers[i],
                ));
                return false;
            }
            let first = seen.insert((i, name));
            if !first {
                shadowed.push(format!(
                    "router `{}` lists {kind} `{name}` twice; its first entry is served",
                    routers[i]
                ));
            }
            first
        })
        .collect()
}

/// Whether `s` holds a character no name or URI should: a control
/// character (C0, DEL, C1), a line or paragraph separator, or an invisible
/// formatting one (zero-width, bidi embeddings, overrides and isolates,
/// the byte-order mark, the soft hyphen, Unicode tags).
pub fn unfit_text(s: &str) -> bool {
    s.chars().any(|c| {
        c.is_control()
            || matches!(
                c,
                '\u{00AD}'
                    | '\u{200B}'..='\u{200F}'
                    | '\u{2028}'..='\u{202E}'
                    | '\u{2060}'..='\u{2064}'
                    | '\u{2066}'..='\u{2069}'
                    | '\u{FEFF}'
                    | '\u{E0000}'..='\u{E007F}'
            )
    })
}

fn qualify<T: Clone>(
    kind: &'static str,
    items: &[(usize, &T, &str)],
    routers: &[String],
    prefix: &dyn Fn(usize) -> String,
    separator: &str,
) -> Result<Qualified<T>, RouteError> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (_, _, name) in items {
        *count.entry(name).or_default() += 1;
    }
    let mut map = Names::<Target>::default();
    let mut list = Vec::with_capacity(items.len());
    for &(i, item, name) in items {
        let exposed: Box<str> = if count[name] > 1 {
            format!("{}{separator}{name}", prefix(i)).into()
        } else {
            name.into()
        };
        let target = Target {
            router: i as RouterId,
            name: name.into(),
            listed: list.len(),
        };
        if let Some(prev) = map.get(&exposed) {
            return Err(RouteError::Collision {
                kind,
                name: exposed.to_string(),
                a: routers[prev.router as usize].clone(),
                b: routers[i].clone(),
            });
        }
        map.insert(exposed.clone(), target);
        list.push(Listed {
            router: i as RouterId,
            exposed,
            item: item.clone(),
        });
    }
    Ok((map, list))
}

/// A router's tool whose `x-mcp-header` declarations MCP 2026-07-28 calls
/// invalid (a native router's mistake, a session-era upstream's listing,
/// where the keyword means nothing), which a client of that revision MUST
/// drop, is served without them: the modern edge then expects no header
/// for it, and clients keep it. The rules: `header_declarations.rs`.
mod header_declarations {
    use crate::header_declarations::{check, strip};

    /// Takes the declarations out of `schema` (JSON text) when they break
    /// a rule; says which.
    pub fn strip_if_invalid(schema: &mut String) -> Option<String> {
        if !schema.contains("x-mcp-header") {
            return None;
        }
        let mut v: serde_json::Value = serde_json::from_str(schema).ok()?;
        let why = check(&v).err()?;
        strip(&mut v);
        *schema = v.to_string();
        Some(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_with_invalid_header_declarations_is_served_without_them() {
        let valid = r#"{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"Region"},"d":{"type":"object","default":{"x-mcp-header":"Data"}}}}"#;
        let mut s = valid.to_owned();
        assert_eq!(header_declarations::strip_if_invalid(&mut s), None);
        assert_eq!(s, valid, "a valid schema is kept as written");
        for (bad, why) in [
            (
                r#"{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"Region"},"n":{"type":"number","x-mcp-header":"N"}}}"#,
                "not a string, integer or boolean",
            ),
            (
                r#"{"properties":{"a":{"type":"string","x-mcp-header":"Has Space"}}}"#,
                "not a header name",
            ),
            (
                r#"{"properties":{"a":{"type":"string","x-mcp-header":"A"},"b":{"type":"integer","x-mcp-header":"a"}}}"#,
                "declared twice",
            ),
            (
                r#"{"properties":{"a":{"type":"array","items":{"type":"string","x-mcp-header":"A"}}}}"#,
                "reached through",
            ),
        ] {
            let mut s = bad.to_owned();
            let got = header_declarations::strip_if_invalid(&mut s).expect(bad);
            assert!(got.contains(why), "{bad}: {got}");
            assert!(!s.contains("x-mcp-header"), "{s}");
            // The rest of the schema stays.
            assert!(s.contains(r#""properties""#), "{s}");
        }
        // Through the table: the note names router and tool.
        let mut t = tool("geo");
        t.input_schema =
            r#"{"type":"object","properties":{"n":{"type":"number","x-mcp-header":"N"}}}"#.into();
        let up = RouterEntry {
            name: "up".into(),
            prefix: None,
            meta: Arc::new(RouterMeta {
                name: "up".into(),
                tools: vec![t],
                ..Default::default()
            }),
        };
        let table = RouteTable::build(&[up], "__").unwrap();
        assert!(
            !table.tool_list[0]
                .item
                .input_schema
                .contains("x-mcp-header"),
            "{}",
            table.tool_list[0].item.input_schema
        );
        assert!(
            table
                .shadowed
                .iter()
                .any(|n| n.contains("`up`") && n.contains("`geo`")),
            "{:?}",
            table.shadowed
        );
    }

    fn tool(name: &str) -> Tool {
        Tool {
            name: name.into(),
            title: None,
            description: String::new(),
            input_schema: "{}".into(),
            output_schema: None,
            annotations: None,
            meta: None,
        }
    }

    fn resource(uri: &str) -> McpResource {
        McpResource {
            uri: uri.into(),
            name: uri.into(),
            title: None,
            description: None,
            mime_type: "text/plain".into(),
            annotations: None,
        }
    }

    fn entry(name: &str, prefix: Option<&str>, tools: &[&str], resources: &[&str]) -> RouterEntry {
        RouterEntry {
            name: name.into(),
            prefix: prefix.map(Into::into),
            meta: Arc::new(RouterMeta {
                name: name.into(),
                tools: tools.iter().map(|t| tool(t)).collect(),
                resources: resources.iter().map(|r| resource(r)).collect(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn unique_names_are_served_bare_and_collisions_are_qualified() {
        let t = RouteTable::build(
            &[
                entry("a", None, &["echo", "only_a"], &[]),
                entry("b", Some("bee"), &["echo"], &[]),
            ],
            "__",
        )
        .unwrap();
        assert_eq!(
            t.tool("only_a"),
            Some(&Target {
                router: 0,
                name: "only_a".into(),
                listed: 1,
            })
        );
        assert_eq!(t.tool("echo"), None, "a colliding bare name is not served");
        assert_eq!(
            t.tool("a__echo"),
            Some(&Target {
                router: 0,
                name: "echo".into(),
                listed: 0,
            })
        );
        assert_eq!(
            t.tool("bee__echo"),
            Some(&Target {
                router: 1,
                name: "echo".into(),
                listed: 2,
            })
        );
        let names: Vec<_> = t.tool_list.iter().map(|l| &*l.exposed).collect();
        assert_eq!(names, ["a__echo", "only_a", "bee__echo"]);
        for name in names {
            assert_eq!(&*t.listed_tool(name).unwrap().exposed, name);
        }
        assert!(t.listed_tool("echo").is_none());
    }

    #[test]
    fn unresolvable_collision_names_both_routers() {
        let err = RouteTable::build(
            &[
                entry("a", Some("p"), &["x"], &[]),
                entry("b", Some("p"), &["x"], &[]),
            ],
            "__",
        )
        .unwrap_err();
        assert_eq!(
            err,
            RouteError::Collision {
                kind: "tool",
                name: "p__x".into(),
                a: "a".into(),
                b: "b".into()
            }
        );
    }

    #[test]
    fn a_uri_two_routers_list_goes_to_the_first_and_the_rest_is_served() {
        let t = RouteTable::build(
            &[
                entry("one", None, &["echo"], &["demo://r/1", "demo://t/{id}"]),
                entry(
                    "two",
                    None,
                    &["echo", "echo"],
                    &["demo://r/1", "demo://t/{id}", "demo://r/2", "demo://r/2"],
                ),
            ],
            "__",
        )
        .unwrap();
        assert_eq!(t.resource("demo://r/1"), Some(0));
        assert_eq!(t.resource("demo://t/7"), Some(0));
        assert_eq!(t.resource("demo://r/2"), Some(1));
        let uris: Vec<_> = t.resource_list.iter().map(|l| &*l.exposed).collect();
        assert_eq!(uris, ["demo://r/1", "demo://r/2"]);
        assert_eq!(t.template_list.len(), 1);
        // A name no client can call as meant is left out, and said.
        let t2 = RouteTable::build(
            &[entry(
                "one",
                None,
                &[
                    "ok",
                    "",
                    "a\nb",
                    "txt\u{202E}exe",
                    "zero\u{200B}width",
                    "é_ok",
                ],
                &["demo://ok", "demo://a\u{1b}b"],
            )],
            "__",
        )
        .unwrap();
        let names: Vec<_> = t2.tool_list.iter().map(|l| &*l.exposed).collect();
        assert_eq!(names, ["ok", "é_ok"]);
        let uris: Vec<_> = t2.resource_list.iter().map(|l| &*l.exposed).collect();
        assert_eq!(uris, ["demo://ok"]);
        assert_eq!(t2.shadowed.len(), 5, "{:?}", t2.shadowed);
        assert!(
            t2.shadowed[1].contains("(`a\nb`)") && t2.shadowed[4].contains("resource whose URI"),
            "{:?}",
            t2.shadowed
        );
        // The second router's tools are served, its own duplicate once.
        let names: Vec<_> = t.tool_list.iter().map(|l| &*l.exposed).collect();
        assert_eq!(names, ["one__echo", "two__echo"]);
        assert_eq!(
            t.shadowed,
            [
                "router `two` lists tool `echo` twice; its first entry is served",
                "resource `demo://r/1` of router `two` is not served: router `one`, listed first, serves that URI (a prefix never applies to URIs)",
                "resource `demo://t/{id}` of router `two` is not served: router `one`, listed first, serves that URI (a prefix never applies to URIs)",
                "router `two` lists resource `demo://r/2` twice; its first entry is served",
            ]
        );
    }

    #[test]
    fn resources_route_by_exact_uri_then_template_then_scheme() {
        let t = RouteTable::build(
            &[
                entry(
                    "library",
                    None,
                    &[],
                    &["lib://docs/readme", "lib://books/{id}"],
                ),
                entry("kv", None, &[], &["kv://seed"]),
                entry("other", None, &[], &["lib://x"]),
            ],
            "__",
        )
        .unwrap();
        assert_eq!(t.resource("lib://docs/readme"), Some(0));
        assert_eq!(t.resource("lib://books/42"), Some(0));
        assert_eq!(t.resource("kv://created-later"), Some(1));
        assert_eq!(
            t.resource("lib://unknown"),
            None,
            "scheme shared by two routers"
        );
        assert_eq!(t.resource("nope"), None);
        assert_eq!(
            t.resource("other://anything"),
            Some(2),
            "scheme named after a router"
        );
        assert_eq!(t.template_list.len(), 1);
    }
}
