//! `library`: resources, resource templates, prompts with arguments and
//! completion, over a small fixed catalogue of books.
//!
//! Conventions this WIT leaves open (documented in `routers/README.md`):
//! - **Resource templates.** The world has no `list-resource-templates`; a
//!   resource returned by `list-resources` whose URI contains an RFC 6570
//!   `{var}` expression is a template (`library://books/{id}`).
//! - **Prompt arguments.** `get-prompt` receives only the prompt name; the
//!   messages carry `{{arg}}` placeholders that the broker fills from the
//!   client's arguments.
//! - **Completion.** `complete` takes the MCP `completion/complete` params as
//!   JSON (`{"ref":{...},"argument":{"name","value"}}`) and answers one text
//!   block per suggested value.
//!
//! # Invariants
//! - Stateless: the catalogue is constant, so every instance answers alike.

wit_bindgen::generate!({ path: "../../wit", world: "mcp-router" });

use exports::wasix::mcp::router::{
    BlobResourceContents, CompletionError, CompletionRequest, CompletionResponse,
    CompletionsCapability, ContentBlock, GetPromptResult, Guest, McpResource, Prompt,
    PromptArgument, PromptError, PromptMessage, PromptMessageContent, PromptMessageRole,
    PromptsCapability, ReadResourceResult, ResourceContents, ResourceError, ResourceLinkContent,
    ResourceMetadata, ResourcesCapability, Response, ServerCapabilities, ServerDescription,
    TextContent, TextResourceContents, Tool, ToolError, ToolResult, ToolsCapability,
};

struct Book {
    id: &'static str,
    title: &'static str,
    author: &'static str,
}

const BOOKS: &[Book] = &[
    Book {
        id: "1",
        title: "The Pragmatic Programmer",
        author: "Hunt, Thomas",
    },
    Book {
        id: "2",
        title: "Structure and Interpretation of Computer Programs",
        author: "Abelson, Sussman",
    },
    Book {
        id: "3",
        title: "The Art of Computer Programming",
        author: "Knuth",
    },
    Book {
        id: "12",
        title: "Programming Rust",
        author: "Blandy, Orendorff, Tindall",
    },
];

const README_URI: &str = "library://readme";
const README: &str = "# Library\n\nA fixed catalogue of books, served as resources.\n";
const COVER_URI: &str = "library://cover.bin";
/// Bytes of the blob resource; served base64-encoded.
pub const COVER: &[u8] = &[
    0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0xff, 0x10,
];
const BOOK_TEMPLATE: &str = "library://books/{id}";
const BOOK_PREFIX: &str = "library://books/";
const STYLES: &[&str] = &["concise", "detailed", "playful"];

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn book_json(b: &Book) -> String {
    serde_json::json!({ "id": b.id, "title": b.title, "author": b.author }).to_string()
}

fn resource(uri: &str, name: &str, description: &str, mime: &str) -> McpResource {
    McpResource {
        uri: uri.into(),
        name: name.into(),
        title: None,
        description: Some(description.into()),
        mime_type: mime.into(),
        annotations: None,
    }
}

fn text_message(role: PromptMessageRole, text: &str) -> PromptMessage {
    PromptMessage {
        role,
        content: PromptMessageContent::Text(TextContent {
            text: text.into(),
            annotations: None,
        }),
    }
}

fn prompt_arg(name: &str, description: &str, required: bool) -> PromptArgument {
    PromptArgument {
        name: name.into(),
        description: Some(description.into()),
        required: Some(required),
    }
}

struct Library;

impl Guest for Library {
    fn name() -> String {
        "library".into()
    }

    fn title() -> Option<String> {
        Some("Library".into())
    }

    fn instructions() -> String {
        "Read library://readme, library://cover.bin or library://books/{id}; prompts \
         summarize_book and compare_books take arguments (filled into {{arg}} placeholders); \
         complete suggests book ids and styles; the tool `search` finds books by title."
            .into()
    }

    fn describe_server() -> ServerDescription {
        ServerDescription {
            name: Self::name(),
            title: Self::title(),
            capabilities: ServerCapabilities {
                prompts: Some(PromptsCapability {
                    list_changed: Some(false),
                }),
                resources: Some(ResourcesCapability {
                    subscribe: Some(false),
                    list_changed: Some(false),
                }),
                tools: Some(ToolsCapability {
                    list_changed: Some(false),
                }),
                completions: Some(CompletionsCapability { enabled: true }),
            },
            resources: Some(Self::list_resources()),
            // The scope its tools and resources would ask for behind an
            // authorization server: a broker running `[auth]` advertises it
            // in its RFC 9728 metadata.
            resource_metadata: Some(vec![ResourceMetadata {
                authorization_servers: Vec::new(),
                resource_indicator: "library://".into(),
                default_scopes: vec!["library:read".into()],
            }]),
            meta: None,
        }
    }

    fn list_tools() -> Vec<Tool> {
        vec![Tool {
            name: "search".into(),
            title: Some("Search books".into()),
            description:
                "Returns a resource link per book whose title contains `query` (case-insensitive)."
                    .into(),
            input_schema:
                r#"{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}"#
                    .into(),
            output_schema: None,
            annotations: None,
            meta: None,
        }]
    }

    fn call_tool(tool_name: String, arguments: String) -> Result<Response, ToolError> {
        if tool_name != "search" {
            return Err(ToolError::NotFound(format!("no tool `{tool_name}`")));
        }
        let args: serde_json::Value = serde_json::from_str(&arguments)
            .map_err(|e| ToolError::InvalidParameters(format!("arguments: {e}")))?;
        let Some(query) = args.get("query").and_then(|q| q.as_str()) else {
            return Err(ToolError::InvalidParameters(
                "`query` (string) is required".into(),
            ));
        };
        let query = query.to_lowercase();
        let content = BOOKS
            .iter()
            .filter(|b| b.title.to_lowercase().contains(&query))
            .map(|b| {
                ContentBlock::ResourceLink(ResourceLinkContent {
                    uri: format!("{BOOK_PREFIX}{}", b.id),
                    title: Some(b.title.into()),
                    description: Some(b.author.into()),
                    mime_type: Some("application/json".into()),
                    annotations: None,
                })
            })
            .collect();
        Ok(Response::Completed(ToolResult {
            content,
            structured_content: None,
            progress: None,
            meta: None,
            is_error: None,
        }))
    }

    fn list_resources() -> Vec<McpResource> {
        vec![
            resource(
                README_URI,
                "readme",
                "What this library is",
                "text/markdown",
            ),
            resource(
                COVER_URI,
                "cover",
                "A small binary blob",
                "application/octet-stream",
            ),
            resource(
                BOOK_TEMPLATE,
                "book",
                "A book by id (resource template)",
                "application/json",
            ),
        ]
    }

    fn read_resource(uri: String) -> Result<ReadResourceResult, ResourceError> {
        let contents = if uri == README_URI {
            ResourceContents::Text(TextResourceContents {
                uri,
                mime_type: Some("text/markdown".into()),
                text: README.into(),
            })
        } else if uri == COVER_URI {
            ResourceContents::Blob(BlobResourceContents {
                uri,
                mime_type: Some("application/octet-stream".into()),
                blob: base64(COVER),
            })
        } else if let Some(id) = uri.strip_prefix(BOOK_PREFIX) {
            let Some(book) = BOOKS.iter().find(|b| b.id == id) else {
                return Err(ResourceError::NotFound(format!("no book with id `{id}`")));
            };
            ResourceContents::Text(TextResourceContents {
                uri,
                mime_type: Some("application/json".into()),
                text: book_json(book),
            })
        } else {
            return Err(ResourceError::NotFound(format!("no resource `{uri}`")));
        };
        Ok(ReadResourceResult {
            contents: vec![contents],
        })
    }

    fn list_prompts() -> Vec<Prompt> {
        vec![
            Prompt {
                name: "summarize_book".into(),
                description: Some("Summarize one book in a given style".into()),
                arguments: Some(vec![
                    prompt_arg("book_id", "Id of the book", true),
                    prompt_arg("style", "concise, detailed or playful", false),
                ]),
            },
            Prompt {
                name: "compare_books".into(),
                description: Some("Compare two books".into()),
                arguments: Some(vec![
                    prompt_arg("first", "Id of the first book", true),
                    prompt_arg("second", "Id of the second book", true),
                ]),
            },
        ]
    }

    fn get_prompt(prompt_name: String) -> Result<GetPromptResult, PromptError> {
        match prompt_name.as_str() {
            "summarize_book" => Ok(GetPromptResult {
                description: Some("Summarize one book".into()),
                messages: vec![
                    text_message(
                        PromptMessageRole::User,
                        "Summarize the book library://books/{{book_id}} in a {{style}} style.",
                    ),
                    text_message(
                        PromptMessageRole::Assistant,
                        "I will read library://books/{{book_id}} first.",
                    ),
                ],
            }),
            "compare_books" => Ok(GetPromptResult {
                description: Some("Compare two books".into()),
                messages: vec![text_message(
                    PromptMessageRole::User,
                    "Compare library://books/{{first}} with library://books/{{second}}.",
                )],
            }),
            other => Err(PromptError::NotFound(format!("no prompt `{other}`"))),
        }
    }

    fn complete(request: CompletionRequest) -> Result<CompletionResponse, CompletionError> {
        let input: serde_json::Value = serde_json::from_str(&request.input)
            .map_err(|e| CompletionError::InvalidParameters(format!("input: {e}")))?;
        let field = |path: &[&str]| -> Result<String, CompletionError> {
            let mut v = &input;
            for p in path {
                v = v.get(p).ok_or_else(|| {
                    CompletionError::InvalidParameters(format!("`{}` is required", path.join(".")))
                })?;
            }
            v.as_str().map(str::to_owned).ok_or_else(|| {
                CompletionError::SchemaError(format!("`{}` must be a string", path.join(".")))
            })
        };
        let ref_type = field(&["ref", "type"])?;
        let arg_name = field(&["argument", "name"])?;
        let prefix = field(&["argument", "value"])?;
        let candidates: Vec<&str> = match ref_type.as_str() {
            "ref/prompt" => {
                let prompt = field(&["ref", "name"])?;
                match (prompt.as_str(), arg_name.as_str()) {
                    ("summarize_book", "book_id")
                    | ("compare_books", "first")
                    | ("compare_books", "second") => BOOKS.iter().map(|b| b.id).collect(),
                    ("summarize_book", "style") => STYLES.to_vec(),
                    ("summarize_book" | "compare_books", _) => {
                        return Err(CompletionError::NotFound(format!(
                            "prompt `{prompt}` has no argument `{arg_name}`"
                        )));
                    }
                    _ => return Err(CompletionError::NotFound(format!("no prompt `{prompt}`"))),
                }
            }
            "ref/resource" => {
                let uri = field(&["ref", "uri"])?;
                if uri != BOOK_TEMPLATE || arg_name != "id" {
                    return Err(CompletionError::NotFound(format!(
                        "no template `{uri}` with variable `{arg_name}`"
                    )));
                }
                BOOKS.iter().map(|b| b.id).collect()
            }
            other => {
                return Err(CompletionError::InvalidParameters(format!(
                    "unknown ref type `{other}`"
                )));
            }
        };
        Ok(CompletionResponse {
            content: candidates
                .into_iter()
                .filter(|c| c.starts_with(prefix.as_str()))
                .map(|c| {
                    ContentBlock::Text(TextContent {
                        text: c.into(),
                        annotations: None,
                    })
                })
                .collect(),
            meta: None,
            is_error: None,
        })
    }
}

export!(Library);
