//! MCP 2026-07-28's rules for `x-mcp-header` (server/tools): a
//! declaration is a non-empty RFC 9110 token, unique within the schema
//! ignoring case, on a `string`, `integer` or `boolean` property reached
//! from the root through `properties` alone; a tool that breaks one is
//! invalid, and a client MUST drop it.
//!
//! One file, two crates: the broker's route table (`route.rs`) and the
//! `upstream` router (`routers/upstream/src/modern.rs`, a client of
//! 2026-07-28 servers) include it by `#[path]`, so that both judge a
//! schema alike. It needs `serde_json` only.

use serde_json::Value;

#[derive(Clone, Copy, PartialEq)]
enum Place {
    Root,
    Property,
    Elsewhere,
}

/// Keys whose values are data, not schemas.
const DATA: [&str; 4] = ["default", "const", "enum", "examples"];

/// Why `schema`'s declarations make its tool invalid, or `Ok`.
pub fn check(schema: &Value) -> Result<(), String> {
    walk(schema, Place::Root, &mut Vec::new())
}

fn walk(v: &Value, place: Place, names: &mut Vec<String>) -> Result<(), String> {
    let Value::Object(o) = v else {
        return Ok(());
    };
    if let Some(decl) = o.get("x-mcp-header") {
        if place != Place::Property {
            return Err("one is not on a property reached through `properties` alone".into());
        }
        let Some(name) = decl.as_str() else {
            return Err(format!("{decl} is not a string"));
        };
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(format!("{name:?} is not a header name"));
        }
        if !matches!(
            o.get("type").and_then(Value::as_str),
            Some("string" | "integer" | "boolean")
        ) {
            return Err(format!(
                "{name:?} is on a property that is not a string, integer or boolean"
            ));
        }
        let lower = name.to_ascii_lowercase();
        if names.contains(&lower) {
            return Err(format!("{name:?} is declared twice"));
        }
        names.push(lower);
    }
    for (key, x) in o {
        match key.as_str() {
            "x-mcp-header" => {}
            k if DATA.contains(&k) => {}
            // Maps of names to schemas.
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                let inner = if key == "properties" && place != Place::Elsewhere {
                    Place::Property
                } else {
                    Place::Elsewhere
                };
                if let Value::Object(m) = x {
                    for s in m.values() {
                        walk(s, inner, names)?;
                    }
                }
            }
            _ => match x {
                Value::Array(a) => {
                    for s in a {
                        walk(s, Place::Elsewhere, names)?;
                    }
                }
                _ => walk(x, Place::Elsewhere, names)?,
            },
        }
    }
    Ok(())
}

/// Removes every declaration from `v` (in schema positions, not data).
#[allow(dead_code)] // The upstream router only checks.
pub fn strip(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.remove("x-mcp-header");
            for (key, x) in o.iter_mut() {
                if !DATA.contains(&key.as_str()) {
                    strip(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip),
        _ => {}
    }
}
