"""The scenario every stock Python client runs against the broker's bundled
routers (`echo`, `kv`, `library`; broker/broker.example.toml), whatever SDK
drives it: `sdk1_client.py` (mcp 1.x) and `sdk2_client.py` (mcp 2.x) each
wrap their SDK in a small adapter and call `run`.

Results are compared as their JSON wire form (`model_dump(by_alias=True)`),
so one set of checks serves both SDKs, whose models spell fields differently
(1.x `structuredContent`, 2.x `structured_content`).

Any mismatch raises `Mismatch`, which the scripts turn into a non-zero exit
with the step, what was expected and what came back.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any, Callable, Coroutine, Protocol

# Tools the embedded default config serves (names are unique across the
# routers, so none is prefixed).
BUNDLED_TOOLS = {"echo", "echo_text", "put", "get", "delete", "list", "search"}
BUNDLED_PROMPTS = {"summarize_book", "compare_books"}
README_URI = "library://readme"
BOOK_TEMPLATE = "library://books/{id}"


class Mismatch(Exception):
    pass


class Session(Protocol):
    """One MCP session (one `Mcp-Session-Id`), already initialized."""

    protocol_version: str
    server_name: str

    async def ping(self) -> None: ...
    async def list_tools(self, cursor: str | None) -> Any: ...
    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any: ...
    async def list_resources(self, cursor: str | None) -> Any: ...
    async def list_resource_templates(self, cursor: str | None) -> Any: ...
    async def read_resource(self, uri: str) -> Any: ...
    async def list_prompts(self, cursor: str | None) -> Any: ...
    async def get_prompt(self, name: str, arguments: dict[str, str]) -> Any: ...
    async def complete_prompt_argument(self, prompt: str, argument: str, value: str) -> Any: ...


def wire(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def expect(step: str, ok: bool, expected: Any, got: Any) -> None:
    if not ok:
        raise Mismatch(
            f"{step}: expected {json.dumps(expected, sort_keys=True)}\n"
            f"  got {json.dumps(got, sort_keys=True, default=str)}"
        )
    print(f"ok: {step}", flush=True)


async def all_pages(step: str, fetch: Callable[[str | None], Any], key: str) -> list[dict[str, Any]]:
    """Every item of a paginated listing; bounded so that a cursor loop fails."""
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        page = wire(await fetch(cursor))
        items.extend(page.get(key, []))
        cursor = page.get("nextCursor")
        if not cursor:
            return items
    raise Mismatch(f"{step}: more than 100 pages (a cursor that never ends?)")


def single_text(step: str, result: dict[str, Any]) -> str:
    content = result.get("content", [])
    expect(
        f"{step} answers one text block",
        not result.get("isError") and len(content) == 1 and content[0].get("type") == "text",
        {"isError": False, "content": [{"type": "text", "text": "..."}]},
        result,
    )
    return content[0]["text"]


async def tool_fails(session: Session, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """Calls a tool expected to fail: a JSON-RPC error or an `isError` result
    both count as failing (the spec allows either for a tool's own error)."""
    try:
        result = wire(await session.call_tool(name, arguments))
    except Exception as e:  # the SDKs raise their McpError / MCPError here
        return True, f"{type(e).__name__}: {e}"
    return bool(result.get("isError")), result


async def run(label: str, connect: Callable[[], AbstractAsyncContextManager[Session]]) -> None:
    async with connect() as s:
        print(f"{label}: initialized, protocol {s.protocol_version}, server {s.server_name!r}", flush=True)
        await s.ping()
        print("ok: ping", flush=True)

        tools = await all_pages("tools/list", s.list_tools, "tools")
        names = {t["name"] for t in tools}
        expect("tools/list has the bundled tools", BUNDLED_TOOLS <= names, sorted(BUNDLED_TOOLS), sorted(names))

        # echo hands back the very JSON it was given, as text and as
        # structured content.
        args = {"greeting": "héllo, wörld", "n": 3, "nested": {"ok": True, "list": [1, 2.5, None]}}
        result = wire(await s.call_tool("echo", args))
        text = single_text("tools/call echo", result)
        expect("echo's text is its arguments", json.loads(text) == args, args, text)
        expect(
            "echo's structuredContent is its arguments",
            result.get("structuredContent") == args,
            args,
            result.get("structuredContent"),
        )

        result = wire(await s.call_tool("echo_text", {"text": f"from {label}"}))
        text = single_text("tools/call echo_text", result)
        expect("echo_text answers its text", text == f"from {label}", f"from {label}", text)

        # kv keeps its state within the session: put, then get, overwrite
        # (`replaced` says the key was there), list and the kv:// resource.
        key = f"{label}-{uuid.uuid4().hex[:8]}"
        value = {"client": label, "values": [1, 2, 3]}
        result = wire(await s.call_tool("put", {"key": key, "value": value}))
        expect(
            "kv put stores a new key",
            not result.get("isError") and result.get("structuredContent") == {"key": key, "replaced": False},
            {"structuredContent": {"key": key, "replaced": False}},
            result,
        )
        text = single_text("kv get in the same session", wire(await s.call_tool("get", {"key": key})))
        expect("kv get returns what put stored", json.loads(text) == value, value, text)
        value2 = {"client": label, "values": [4]}
        result = wire(await s.call_tool("put", {"key": key, "value": value2}))
        expect(
            "kv put again replaces the key",
            result.get("structuredContent") == {"key": key, "replaced": True},
            {"structuredContent": {"key": key, "replaced": True}},
            result,
        )
        text = single_text("kv get after the overwrite", wire(await s.call_tool("get", {"key": key})))
        expect("kv get returns the new value", json.loads(text) == value2, value2, text)
        result = wire(await s.call_tool("list", {}))
        keys = result.get("structuredContent", {}).get("keys")
        expect("kv list shows the key", keys is not None and key in keys, [key], result)

        # A second session at the same time has its own kv state.
        async with connect() as other:
            failed, got = await tool_fails(other, "get", {"key": key})
            expect("another session does not see this session's kv key", failed, "an error (no key)", got)
        text = single_text("kv get after the other session", wire(await s.call_tool("get", {"key": key})))
        expect("this session still has its key", json.loads(text) == value2, value2, text)

        # library: resources, the book template, and prompts with arguments.
        resources = await all_pages("resources/list", s.list_resources, "resources")
        uris = {r["uri"] for r in resources}
        expect("resources/list has library://readme", README_URI in uris, [README_URI], sorted(uris))
        templates = await all_pages(
            "resources/templates/list", s.list_resource_templates, "resourceTemplates"
        )
        expect(
            "resources/templates/list has the book template",
            BOOK_TEMPLATE in {t.get("uriTemplate") for t in templates},
            [BOOK_TEMPLATE],
            templates,
        )
        result = wire(await s.read_resource(README_URI))
        contents = result.get("contents", [])
        expect(
            "resources/read library://readme",
            len(contents) == 1 and contents[0].get("text", "").startswith("# Library"),
            {"contents": [{"uri": README_URI, "text": "# Library..."}]},
            result,
        )
        result = wire(await s.read_resource("library://books/12"))
        contents = result.get("contents", [])
        book = json.loads(contents[0]["text"]) if len(contents) == 1 and "text" in contents[0] else None
        expected_book = {"id": "12", "title": "Programming Rust", "author": "Blandy, Orendorff, Tindall"}
        expect("resources/read library://books/12 (templated)", book == expected_book, expected_book, result)

        result = wire(await s.call_tool("search", {"query": "programming"}))
        links = sorted(c.get("uri", "") for c in result.get("content", []) if c.get("type") == "resource_link")
        want = ["library://books/12", "library://books/3"]
        expect("library search answers resource links", links == want, want, result)

        prompts = await all_pages("prompts/list", s.list_prompts, "prompts")
        names = {p["name"] for p in prompts}
        expect("prompts/list has the library prompts", BUNDLED_PROMPTS <= names, sorted(BUNDLED_PROMPTS), sorted(names))
        result = wire(await s.get_prompt("summarize_book", {"book_id": "12", "style": "concise"}))
        got = [(m.get("role"), m.get("content", {}).get("text")) for m in result.get("messages", [])]
        want = [
            ("user", "Summarize the book library://books/12 in a concise style."),
            ("assistant", "I will read library://books/12 first."),
        ]
        expect("prompts/get fills the arguments in", got == [tuple(w) for w in want], want, result)
        result = wire(await s.get_prompt("compare_books", {"first": "1", "second": "3"}))
        got = [m.get("content", {}).get("text") for m in result.get("messages", [])]
        want = ["Compare library://books/1 with library://books/3."]
        expect("prompts/get with two arguments", got == want, want, result)

        result = wire(await s.complete_prompt_argument("summarize_book", "book_id", "1"))
        values = sorted(result.get("completion", {}).get("values", []))
        expect("completion/complete suggests book ids", values == ["1", "12"], ["1", "12"], result)

    print(f"{label} client: ok", flush=True)


def leaves(e: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: the SDKs run on anyio
    task groups, which wrap whatever the scenario raises."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in leaves(sub)]
    return [e]


def main(label: str, connect: Callable[[], AbstractAsyncContextManager[Session]], timeout: float = 60) -> int:
    """Runs the scenario; 0 when every check passed, else 1 with the reason
    on stderr (the failed check, or the exception and its traceback)."""
    return checked(label, run(label, connect), timeout)


def checked(label: str, checks: Coroutine[Any, Any, None], timeout: float = 60) -> int:
    """Runs a client script's `checks` within `timeout` seconds: 0 when they
    all passed, else 1 with the reason on stderr (the failed check, or the
    exception and its traceback). The SDKs run on anyio task groups, whose
    exception groups are looked into for the check that failed."""
    try:
        asyncio.run(asyncio.wait_for(checks, timeout))
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then exit 1
        found = leaves(e)
        mismatches = [m for m in found if isinstance(m, Mismatch)]
        sys.stdout.flush()
        if mismatches:
            print(f"{label} client: FAILED: {mismatches[0]}", file=sys.stderr)
            return 1
        if any(isinstance(m, TimeoutError) for m in found):
            print(f"{label} client: FAILED: the checks did not finish within {timeout} s", file=sys.stderr)
        else:
            print(f"{label} client: FAILED: " + "; ".join(f"{type(m).__name__}: {m}" for m in found), file=sys.stderr)
        traceback.print_exception(e)
        return 1
