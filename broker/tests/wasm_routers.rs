//! Every WIT function of every bundled router, through a real pool.

#[path = "fixtures/support.rs"]
mod support;

use mcp_broker::wasm::types::{
    CompletionError, CompletionRequest, ContentBlock, PromptError, PromptMessageContent,
    PromptMessageRole, ResourceContents, ResourceError, Response, ToolError,
};
use mcp_broker::wasm::{CallError, RouterPool};
use support::{first_text, load_bundled, on_shard};

fn completion(input: &str) -> CompletionRequest {
    CompletionRequest {
        input: input.into(),
        streaming: None,
        meta: None,
    }
}

fn texts(content: &[ContentBlock]) -> Vec<&str> {
    content
        .iter()
        .map(|c| match c {
            ContentBlock::Text(t) => t.text.as_str(),
            other => panic!("expected text blocks, got {other:?}"),
        })
        .collect()
}

#[test]
fn echo_metadata_is_read_once_at_load() {
    let router = load_bundled("echo", 1, 0);
    let meta = router.meta();
    assert_eq!(meta.name, "echo");
    assert_eq!(meta.title.as_deref(), Some("Echo"));
    assert!(meta.instructions.contains("echo"));
    let server = meta.server.as_ref().expect("describe-server");
    assert_eq!(server.name, "echo");
    assert!(server.capabilities.tools.is_some());
    assert!(server.capabilities.resources.is_none());
    let tools: Vec<&str> = meta.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tools, ["echo", "echo_text"]);
    assert!(meta.resources.is_empty());
    assert!(meta.prompts.is_empty());
}

#[test]
fn echo_returns_raw_arguments_as_text_and_structured_content() {
    let pool = RouterPool::new(load_bundled("echo", 1, 0));
    let args = r#"{"a": [1, 2, {"b": "c"}],  "unicode": "é"}"#;
    let r = on_shard(pool.call_tool("echo", args)).expect("echo answers");
    assert_eq!(first_text(&r), args);
    match r {
        Response::Completed(t) => {
            assert_eq!(t.structured_content.as_deref(), Some(args));
            assert_eq!(t.is_error, None);
        }
        Response::Elicit(_) => panic!("echo never elicits"),
    }
}

#[test]
fn echo_text_returns_the_text_field_and_rejects_missing_text() {
    let pool = RouterPool::new(load_bundled("echo", 1, 0));
    on_shard(async {
        let r = pool
            .call_tool("echo_text", r#"{"text":"hello"}"#)
            .await
            .unwrap();
        assert_eq!(first_text(&r), "hello");
        let e = pool.call_tool("echo_text", "{}").await.unwrap_err();
        assert!(
            matches!(e, CallError::Tool(ToolError::InvalidParameters(_))),
            "{e:?}"
        );
        assert!(!e.is_fault());
    });
}

#[test]
fn echo_unknown_names_are_router_errors_not_faults() {
    let pool = RouterPool::new(load_bundled("echo", 1, 0));
    on_shard(async {
        let e = pool.call_tool("nope", "{}").await.unwrap_err();
        assert!(
            matches!(e, CallError::Tool(ToolError::NotFound(_))),
            "{e:?}"
        );
        let e = pool.read_resource("echo://x").await.unwrap_err();
        assert!(
            matches!(e, CallError::Resource(ResourceError::NotFound(_))),
            "{e:?}"
        );
        let e = pool.get_prompt("p").await.unwrap_err();
        assert!(
            matches!(e, CallError::Prompt(PromptError::NotFound(_))),
            "{e:?}"
        );
        let e = pool.complete(&completion("{}")).await.unwrap_err();
        assert!(
            matches!(e, CallError::Completion(CompletionError::NotFound(_))),
            "{e:?}"
        );
        assert!(pool.list_resources().await.unwrap().is_empty());
    });
    let stats = pool.stats();
    assert_eq!(
        (stats.faults, stats.replaced),
        (0, 0),
        "router errors keep the instance"
    );
}

#[test]
fn kv_put_get_delete_list_and_one_resource_per_key() {
    let router = load_bundled("kv", 1, 0);
    let meta = router.meta();
    assert_eq!(meta.name, "kv");
    let tools: Vec<&str> = meta.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tools, ["put", "get", "delete", "list"]);
    assert!(meta.resources.is_empty(), "a fresh instance holds no keys");
    assert!(
        meta.server
            .as_ref()
            .unwrap()
            .capabilities
            .resources
            .is_some()
    );
    let pool = RouterPool::new(router);
    on_shard(async {
        pool.call_tool("put", r#"{"key":"b","value":{"n":2}}"#)
            .await
            .unwrap();
        pool.call_tool("put", r#"{"key":"a","value":"one"}"#)
            .await
            .unwrap();
        let r = pool.call_tool("get", r#"{"key":"b"}"#).await.unwrap();
        assert_eq!(first_text(&r), r#"{"n":2}"#);
        let r = pool.call_tool("list", "{}").await.unwrap();
        assert_eq!(first_text(&r), "a\nb");

        let resources = pool.list_resources().await.unwrap();
        let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
        assert_eq!(uris, ["kv://a", "kv://b"]);
        let read = pool.read_resource("kv://a").await.unwrap();
        match &read.contents[..] {
            [ResourceContents::Text(t)] => {
                assert_eq!((t.uri.as_str(), t.text.as_str()), ("kv://a", r#""one""#));
            }
            other => panic!("unexpected contents {other:?}"),
        }

        let r = pool.call_tool("delete", r#"{"key":"a"}"#).await.unwrap();
        assert_eq!(first_text(&r), r#""one""#);
        let e = pool.call_tool("get", r#"{"key":"a"}"#).await.unwrap_err();
        assert!(
            matches!(e, CallError::Tool(ToolError::NotFound(_))),
            "{e:?}"
        );
        let e = pool.read_resource("kv://a").await.unwrap_err();
        assert!(
            matches!(e, CallError::Resource(ResourceError::NotFound(_))),
            "{e:?}"
        );
        let e = pool.call_tool("put", r#"{"value":1}"#).await.unwrap_err();
        assert!(
            matches!(e, CallError::Tool(ToolError::InvalidParameters(_))),
            "{e:?}"
        );
        assert!(pool.get_prompt("x").await.is_err());
        assert!(pool.complete(&completion("{}")).await.is_err());
    });
}

#[test]
fn kv_state_belongs_to_one_instance() {
    // Two pools of the same router stand for two shards: each instance has its
    // own linear memory, so a put on one is invisible to the other.
    let router = load_bundled("kv", 1, 0);
    let shard_a = RouterPool::new(router.clone());
    let shard_b = RouterPool::new(router);
    on_shard(async {
        shard_a
            .call_tool("put", r#"{"key":"k","value":1}"#)
            .await
            .unwrap();
        assert!(shard_a.call_tool("get", r#"{"key":"k"}"#).await.is_ok());
        let e = shard_b
            .call_tool("get", r#"{"key":"k"}"#)
            .await
            .unwrap_err();
        assert!(
            matches!(e, CallError::Tool(ToolError::NotFound(_))),
            "{e:?}"
        );
    });
}

#[test]
fn library_lists_text_blob_and_template_resources() {
    let router = load_bundled("library", 1, 0);
    let meta = router.meta();
    assert_eq!(meta.name, "library");
    let caps = &meta.server.as_ref().unwrap().capabilities;
    assert!(caps.prompts.is_some() && caps.resources.is_some() && caps.tools.is_some());
    assert!(caps.completions.as_ref().is_some_and(|c| c.enabled));
    let uris: Vec<&str> = meta.resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(
        uris,
        [
            "library://readme",
            "library://cover.bin",
            "library://books/{id}"
        ]
    );
    let templates: Vec<&str> = uris.iter().copied().filter(|u| u.contains('{')).collect();
    assert_eq!(templates, ["library://books/{id}"]);

    let pool = RouterPool::new(router);
    on_shard(async {
        let read = pool.read_resource("library://readme").await.unwrap();
        match &read.contents[..] {
            [ResourceContents::Text(t)] => {
                assert_eq!(t.mime_type.as_deref(), Some("text/markdown"));
                assert!(t.text.starts_with("# Library"));
            }
            other => panic!("unexpected contents {other:?}"),
        }
        let read = pool.read_resource("library://cover.bin").await.unwrap();
        match &read.contents[..] {
            // base64 of 89 50 4e 47 0d 0a 1a 0a 00 ff 10
            [ResourceContents::Blob(b)] => assert_eq!(b.blob, "iVBORw0KGgoA/xA="),
            other => panic!("unexpected contents {other:?}"),
        }
        let read = pool.read_resource("library://books/12").await.unwrap();
        match &read.contents[..] {
            [ResourceContents::Text(t)] => {
                let v: serde_json::Value = serde_json::from_str(&t.text).unwrap();
                assert_eq!(v["title"], "Programming Rust");
            }
            other => panic!("unexpected contents {other:?}"),
        }
        let e = pool.read_resource("library://books/99").await.unwrap_err();
        assert!(
            matches!(e, CallError::Resource(ResourceError::NotFound(_))),
            "{e:?}"
        );
        assert_eq!(pool.list_resources().await.unwrap().len(), 3);
    });
}

#[test]
fn library_prompts_carry_arguments_and_placeholders() {
    let router = load_bundled("library", 1, 0);
    let prompt = router
        .meta()
        .prompts
        .iter()
        .find(|p| p.name == "summarize_book")
        .unwrap();
    let args: Vec<(&str, Option<bool>)> = prompt
        .arguments
        .as_ref()
        .unwrap()
        .iter()
        .map(|a| (a.name.as_str(), a.required))
        .collect();
    assert_eq!(args, [("book_id", Some(true)), ("style", Some(false))]);
    let pool = RouterPool::new(router);
    on_shard(async {
        let p = pool.get_prompt("summarize_book").await.unwrap();
        assert_eq!(p.messages.len(), 2);
        assert!(matches!(p.messages[0].role, PromptMessageRole::User));
        match &p.messages[0].content {
            PromptMessageContent::Text(t) => {
                assert!(t.text.contains("{{book_id}}") && t.text.contains("{{style}}"));
            }
            other => panic!("unexpected content {other:?}"),
        }
        let e = pool.get_prompt("nope").await.unwrap_err();
        assert!(
            matches!(e, CallError::Prompt(PromptError::NotFound(_))),
            "{e:?}"
        );
    });
}

#[test]
fn library_completes_prompt_arguments_and_template_variables() {
    let pool = RouterPool::new(load_bundled("library", 1, 0));
    on_shard(async {
        let ids = r#"{"ref":{"type":"ref/prompt","name":"summarize_book"},"argument":{"name":"book_id","value":"1"}}"#;
        let r = pool.complete(&completion(ids)).await.unwrap();
        assert_eq!(texts(&r.content), ["1", "12"]);
        let styles = r#"{"ref":{"type":"ref/prompt","name":"summarize_book"},"argument":{"name":"style","value":"d"}}"#;
        let r = pool.complete(&completion(styles)).await.unwrap();
        assert_eq!(texts(&r.content), ["detailed"]);
        let template = r#"{"ref":{"type":"ref/resource","uri":"library://books/{id}"},"argument":{"name":"id","value":""}}"#;
        let r = pool.complete(&completion(template)).await.unwrap();
        assert_eq!(texts(&r.content), ["1", "2", "3", "12"]);
        let bad =
            r#"{"ref":{"type":"ref/prompt","name":"nope"},"argument":{"name":"x","value":""}}"#;
        let e = pool.complete(&completion(bad)).await.unwrap_err();
        assert!(
            matches!(e, CallError::Completion(CompletionError::NotFound(_))),
            "{e:?}"
        );
        let e = pool.complete(&completion("not json")).await.unwrap_err();
        assert!(
            matches!(
                e,
                CallError::Completion(CompletionError::InvalidParameters(_))
            ),
            "{e:?}"
        );
    });
}

#[test]
fn library_search_returns_resource_links() {
    let pool = RouterPool::new(load_bundled("library", 1, 0));
    let r = on_shard(pool.call_tool("search", r#"{"query":"computer"}"#)).unwrap();
    let Response::Completed(t) = r else {
        panic!("search never elicits")
    };
    let links: Vec<&str> = t
        .content
        .iter()
        .map(|c| match c {
            ContentBlock::ResourceLink(l) => l.uri.as_str(),
            other => panic!("expected resource links, got {other:?}"),
        })
        .collect();
    assert_eq!(links, ["library://books/2", "library://books/3"]);
}

#[test]
fn chaos_metadata_lists_every_misbehaviour() {
    let router = load_bundled("chaos", 1, 0);
    let tools: Vec<&str> = router
        .meta()
        .tools
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    for t in [
        "trap",
        "panic",
        "loop",
        "alloc",
        "recurse",
        "sleep",
        "spin",
        "elicit",
        "malformed",
        "fail",
    ] {
        assert!(tools.contains(&t), "chaos lacks {t}: {tools:?}");
    }
    let pool = RouterPool::new(router);
    on_shard(async {
        assert!(pool.list_resources().await.unwrap().is_empty());
        assert!(pool.read_resource("x").await.is_err());
        assert!(pool.get_prompt("x").await.is_err());
        assert!(pool.complete(&completion("{}")).await.is_err());
    });
}
