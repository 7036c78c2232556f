//! Loading: components that do not fit the host are refused with a message
//! naming the problem; WASI capabilities exist only when granted.

#[path = "fixtures/support.rs"]
mod support;

use mcp_broker::wasm::types::ToolError;
use mcp_broker::wasm::{
    BUNDLED_ROUTERS, CallError, DirGrant, LoadError, ROUTER_INTERFACE, RouterPool, RouterSpec,
    default_routers_dir,
};
use support::{bundled, first_text, fixture, host, load, on_shard};

#[test]
fn component_exporting_another_world_is_refused_naming_the_missing_export() {
    let spec = RouterSpec::new("wrong", fixture("wrong_world.wat"));
    let e = host().load(&spec).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, LoadError::Incompatible { .. }), "{e:?}");
    assert!(msg.contains(ROUTER_INTERFACE), "{msg}");
    assert!(
        msg.contains("acme:other/api@1.0.0"),
        "lists what it does export: {msg}"
    );
    assert!(msg.contains("router `wrong`"), "{msg}");
}

#[test]
fn component_importing_an_unknown_interface_is_refused_naming_it() {
    let spec = RouterSpec::new("rogue", fixture("unknown_import.wat"));
    let e = host().load(&spec).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, LoadError::Incompatible { .. }), "{e:?}");
    assert!(msg.contains("acme:vault/secrets@1.0.0"), "{msg}");
    assert!(msg.contains("does not provide"), "{msg}");
}

#[test]
fn component_with_a_mistyped_function_is_refused_naming_it() {
    let spec = RouterSpec::new("mistyped", fixture("mistyped_export.wat"));
    let e = host().load(&spec).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "`title` of {ROUTER_INTERFACE} does not have the type wit/mcp-router.wit gives it"
        )),
        "{msg}"
    );
    assert!(msg.contains("router `mistyped`"), "{msg}");
}

/// Dozens of `upstream` routers are one component: compiled once.
#[test]
fn routers_of_one_component_share_its_compiled_code() {
    // A host of its own: the shared one compiles for the other tests.
    let h = mcp_broker::wasm::WasmHost::new(&mcp_broker::wasm::HostConfig {
        max_instances: 8,
        ..Default::default()
    })
    .unwrap();
    let named = |name: &str, file: &str| {
        let mut spec = bundled(file);
        spec.name = name.into();
        spec
    };
    let a = h.load(&named("a", "echo")).unwrap();
    let b = h.load(&named("b", "echo")).unwrap();
    assert_eq!(h.compilations(), 1);
    // Each is still its own router, with its own pool.
    for r in [a, b] {
        let pool = RouterPool::new(r);
        on_shard(async {
            let out = pool.call_tool("echo", r#"{"x":1}"#).await.unwrap();
            assert!(first_text(&out).contains("\"x\""), "{}", first_text(&out));
        });
    }
    h.load(&named("k", "kv")).unwrap();
    assert_eq!(h.compilations(), 2);
}

#[test]
fn a_file_that_is_no_component_is_refused_saying_so() {
    let dir = std::env::temp_dir().join(format!("mcp-garbage-wasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("garbage.wasm");
    std::fs::write(&path, [0xff_u8, 0xfe, 0x00, 0x01, 0x80, 0x81]).unwrap();
    let e = host().load(&RouterSpec::new("garbage", &path)).unwrap_err();
    assert!(matches!(e, LoadError::Compile { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("not a WebAssembly component"), "{msg}");
    assert!(msg.contains("router `garbage`"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_component_file_tells_to_build_the_routers() {
    // A bundled router's file: the hint to build them.
    let spec = RouterSpec::new("echo", "/nonexistent/echo.wasm");
    let e = host().load(&spec).unwrap_err();
    assert!(matches!(e, LoadError::Read { .. }), "{e:?}");
    assert!(e.to_string().contains("scripts/build-routers"), "{e}");
    // An operator's own file: no hint that does not apply.
    let spec = RouterSpec::new("ghost", "/nonexistent/ghost.wasm");
    let e = host().load(&spec).unwrap_err();
    assert!(matches!(e, LoadError::Read { .. }), "{e:?}");
    assert!(!e.to_string().contains("build-routers"), "{e}");
    assert!(e.to_string().contains("/nonexistent/ghost.wasm"), "{e}");
}

#[test]
fn bytes_that_are_not_a_component_are_refused() {
    let spec = RouterSpec::new("junk", fixture("support.rs"));
    let e = host().load(&spec).unwrap_err();
    assert!(matches!(e, LoadError::Compile { .. }), "{e:?}");
}

#[test]
fn invalid_specs_are_refused() {
    let mut spec = bundled("echo");
    spec.instances_per_shard = 0;
    assert!(matches!(host().load(&spec), Err(LoadError::Spec { .. })));
    let mut spec = bundled("echo");
    spec.max_memory_bytes = usize::MAX;
    assert!(matches!(host().load(&spec), Err(LoadError::Spec { .. })));
    let mut spec = bundled("echo");
    spec.grants.read_only_dirs.push(DirGrant {
        host: "/nonexistent/dir".into(),
        guest: "/d".into(),
    });
    assert!(matches!(host().load(&spec), Err(LoadError::Grant { .. })));
}

#[test]
fn default_routers_dir_holds_every_bundled_router() {
    let dir = default_routers_dir();
    for name in BUNDLED_ROUTERS {
        let path = dir.join(format!("{name}.wasm"));
        assert!(
            path.is_file(),
            "{} missing: run scripts/build-routers",
            path.display()
        );
    }
}

/// A directory with one file, of one test's own (tests run in parallel, and
/// none may see another rewrite it), removed when the test ends.
fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("mcp-broker-wasm-grant-")
        .tempdir()
        .expect("a scratch directory");
    std::fs::write(dir.path().join("hello.txt"), "hello from the host").unwrap();
    dir
}

#[test]
fn router_without_a_directory_grant_cannot_read_files() {
    let scratch = data_dir();
    let dir = scratch.path();
    let pool = RouterPool::new(load(&bundled("chaos")));
    on_shard(async {
        for path in [
            "/data/hello.txt",
            dir.join("hello.txt").to_str().unwrap(),
            "/etc/hostname",
        ] {
            let args = serde_json::json!({ "path": path }).to_string();
            let e = pool.call_tool("read_file", &args).await.unwrap_err();
            assert!(
                matches!(e, CallError::Tool(ToolError::ExecutionError(_))),
                "{path}: {e:?}"
            );
        }
    });
}

/// Every router may import `wasi:http/types` (its data types: headers,
/// requests, responses), which sends nothing: `outgoing-handler` is linked
/// for routers granted an upstream only (`upstream.rs` shows a router that
/// imports it refused without one). Toolchains import the types whether a
/// router sends requests or not: every componentize-js build did, and no
/// JavaScript router could load.
#[test]
fn any_router_may_use_wasi_http_types_which_send_nothing() {
    let pool = RouterPool::new(load(&bundled("chaos")));
    on_shard(async {
        let r = pool
            .call_tool("http_fields", r#"{"name":"x-probe","value":"yes"}"#)
            .await
            .unwrap();
        assert_eq!(first_text(&r), "yes");
        // The host's rules for headers still hold.
        let e = pool
            .call_tool("http_fields", r#"{"name":"bad name","value":"x"}"#)
            .await
            .unwrap_err();
        assert!(
            matches!(e, CallError::Tool(ToolError::ExecutionError(_))),
            "{e:?}"
        );
    });
}

/// `max_memory_bytes` is the guest's heap: 80 MiB do not fit the default
/// 64 MiB, and fit a router given 128 MiB (whose answer is then refused
/// for its size instead: max_result_bytes is another bound).
#[test]
fn max_memory_bytes_bounds_what_a_guest_may_allocate() {
    let args = format!(r#"{{"blocks":1,"bytes":{}}}"#, 80 << 20);
    let small = RouterPool::new(load(&bundled("chaos")));
    let mut spec = bundled("chaos");
    spec.max_memory_bytes = 128 << 20;
    let large = RouterPool::new(load(&spec));
    on_shard(async {
        let e = small.call_tool("fanout", &args).await.unwrap_err();
        assert!(matches!(e, CallError::OutOfMemory), "{e:?}");
        let e = large.call_tool("fanout", &args).await.unwrap_err();
        assert!(matches!(e, CallError::ResultTooLarge { .. }), "{e:?}");
    });
    // Below what the component's memory starts at, it cannot load, and the
    // error names the key to raise (the bundled routers start at 17 pages).
    let mut tiny = bundled("echo");
    tiny.max_memory_bytes = 1 << 20;
    let e = host().load(&tiny).unwrap_err().to_string();
    assert!(
        e.contains("raise the router's max_memory_bytes (now 1048576 bytes)"),
        "{e}"
    );
}

#[test]
fn router_with_a_read_only_directory_grant_reads_it_and_nothing_else() {
    let scratch = data_dir();
    let dir = scratch.path();
    let mut spec = bundled("chaos");
    spec.grants.read_only_dirs.push(DirGrant {
        host: dir.to_path_buf(),
        guest: "/data".into(),
    });
    let pool = RouterPool::new(load(&spec));
    on_shard(async {
        let r = pool
            .call_tool("read_file", r#"{"path":"/data/hello.txt"}"#)
            .await
            .unwrap();
        assert_eq!(first_text(&r), "hello from the host");
        let e = pool
            .call_tool("read_file", r#"{"path":"/data/../etc/hostname"}"#)
            .await
            .unwrap_err();
        assert!(
            matches!(e, CallError::Tool(_)),
            "no escape from the preopen: {e:?}"
        );
    });
}

#[test]
fn environment_variables_exist_only_when_granted_by_name() {
    let path = std::env::var("PATH").expect("the test runs with PATH set");
    let plain = RouterPool::new(load(&bundled("chaos")));
    let e = on_shard(plain.call_tool("env", r#"{"name":"PATH"}"#)).unwrap_err();
    assert!(
        matches!(e, CallError::Tool(ToolError::ExecutionError(_))),
        "{e:?}"
    );

    let mut spec = bundled("chaos");
    spec.grants.env.push("PATH".into());
    let granted = RouterPool::new(load(&spec));
    let r = on_shard(granted.call_tool("env", r#"{"name":"PATH"}"#)).unwrap();
    assert_eq!(first_text(&r), path);
    let e = on_shard(granted.call_tool("env", r#"{"name":"HOME"}"#)).unwrap_err();
    assert!(
        matches!(e, CallError::Tool(_)),
        "only named variables pass: {e:?}"
    );
}

#[test]
fn stdio_is_discarded_by_default_without_failing_the_guest() {
    let pool = RouterPool::new(load(&bundled("chaos")));
    let r = on_shard(pool.call_tool("print", r#"{"text":"into the void"}"#)).unwrap();
    assert_eq!(first_text(&r), "printed");
    let mut spec = bundled("chaos");
    spec.grants.stdio_to_stderr = true;
    let pool = RouterPool::new(load(&spec));
    let r =
        on_shard(pool.call_tool("print", r#"{"text":"chaos router says hi on stderr"}"#)).unwrap();
    assert_eq!(first_text(&r), "printed");
}
