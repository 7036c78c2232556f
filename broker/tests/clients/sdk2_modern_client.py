"""The Python `mcp` SDK 2.x `Client`, in its default mode, against the broker
serving protocol 2026-07-28 (stateless, routed by header) on `/mcp`.

`Client` in `auto` mode probes `server/discover`; a server that answers it
with a `supportedVersions` list holding 2026-07-28 is adopted without any
`initialize`. This script checks that on the wire, then lists, calls (one
tool whose schema declares `x-mcp-header`, so the SDK adds `Mcp-Param-*`
headers the broker validates), reads, gets a prompt, and answers an
elicitation by multi round-trip (MRTR): the
first `tools/call` comes back as an `InputRequiredResult`, the SDK calls the
elicitation callback and retries with `inputResponses`, and the tool's
answer carries what the callback said. A tool that asks two questions in
turn gets its own state back each round through `requestState`, which the
broker seals and the SDK echoes; one that asks for the client's roots gets
what the SDK's roots callback says; one that asks for a name, a completion
and the roots at once gets all three callbacks' answers in one retry.

The broker must serve the embedded default routers plus `conformance`
(whose `test_elicitation` elicits): broker/tests/http_clients.rs starts it so.

With a second argument, the broker's `POST /admin/reload` URL, it also
opens a `subscriptions/listen` stream that subscribes to the resource
`kv://sdk2`, writes that key with the kv router's `put` and expects
`notifications/resources/updated` for it on the stream; then calls that URL
(the test has rewritten the config so that the reload adds tools) and
expects `notifications/tools/list_changed` on the stream.

Usage: .tools/mcp2/bin/python sdk2_modern_client.py http://127.0.0.1:PORT/mcp [RELOAD_URL]
Prints one `ok:` line per check and `sdk2-modern client: ok` at the end;
exits 1 with the failed step, the expected and the received value otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated, ToolsListChanged
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from scenario import checked, expect, single_text, wire

MODERN = "2026-07-28"


async def run(url: str, reload_url: str | None) -> None:
    # (JSON-RPC method, HTTP status, request headers, response headers,
    # request body) of every POST, in order.
    posts: list[tuple[str, int, dict[str, str], dict[str, str], dict[str, Any]]] = []

    async def record(response: httpx2.Response) -> None:
        request = response.request
        if request.method != "POST":
            return
        try:
            body = json.loads(request.content)
        except (ValueError, AttributeError):
            body = {}
        posts.append(
            (
                body.get("method", "(response)"),
                response.status_code,
                {k.lower(): v for k, v in request.headers.items()},
                {k.lower(): v for k, v in response.headers.items()},
                body,
            )
        )

    asked: list[types.ElicitRequestParams] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        # test_input_required_result_multi_round asks these two in turn.
        if params.message == "What is your name?":
            return types.ElicitResult(action="accept", content={"name": "Ada"})
        if params.message == "What is your favourite colour?":
            return types.ElicitResult(action="accept", content={"color": "blue"})
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    async def on_list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/project", name="Project")])

    async def on_sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="Hi there"), model="sdk2-test"
        )

    http = create_mcp_http_client()
    http.event_hooks["response"].append(record)
    async with http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(
            transport,
            read_timeout_seconds=20,
            elicitation_callback=on_elicit,
            list_roots_callback=on_list_roots,
            sampling_callback=on_sample,
        ) as c:
            methods = [(m, status) for m, status, *_ in posts]
            expect(
                "connect: server/discover is answered (200) and no initialize follows",
                methods[:1] == [("server/discover", 200)] and all(m != "initialize" for m, _ in methods),
                [("server/discover", 200)],
                methods,
            )
            expect("negotiated version", c.protocol_version == MODERN, MODERN, c.protocol_version)
            print(f"sdk2-modern: discovered, protocol {c.protocol_version}", flush=True)

            tools = wire(await c.list_tools(cache_mode="bypass"))
            names = {t["name"] for t in tools.get("tools", [])}
            want = {"echo", "echo_text", "test_elicitation", "test_param_header"}
            expect("tools/list has echo and test_elicitation", want <= names, sorted(want), sorted(names))

            args = {"greeting": "héllo, wörld", "n": 3, "nested": {"ok": True, "list": [1, 2.5, None]}}
            result = wire(await c.call_tool("echo", args))
            text = single_text("tools/call echo", result)
            expect("echo's text is its arguments", json.loads(text) == args, args, text)
            expect(
                "echo's structuredContent is its arguments",
                result.get("structuredContent") == args,
                args,
                result.get("structuredContent"),
            )
            # x-mcp-header: the SDK sends region and count as Mcp-Param-*
            # headers too (the region non-ASCII, so base64-encoded), and the
            # broker checks them against the body.
            before = len(posts)
            result = wire(await c.call_tool("test_param_header", {"region": "Zürich", "count": 42}))
            text = single_text("tools/call test_param_header", result)
            expect("test_param_header got its arguments", text == 'region="Zürich", count=42', "region=...", text)
            sent = [h for m, _, h, _, _ in posts[before:] if m == "tools/call"]
            expect(
                "the SDK sent Mcp-Param-Region and Mcp-Param-Count",
                len(sent) == 1
                and sent[0].get("mcp-param-region", "").startswith("=?base64?")
                and sent[0].get("mcp-param-count") == "42",
                {"mcp-param-region": "=?base64?...?=", "mcp-param-count": "42"},
                sent,
            )

            result = wire(await c.read_resource("library://readme", cache_mode="bypass"))
            contents = result.get("contents", [])
            expect(
                "resources/read library://readme",
                len(contents) == 1 and contents[0].get("text", "").startswith("# Library"),
                {"contents": [{"uri": "library://readme", "text": "# Library..."}]},
                result,
            )
            result = wire(await c.get_prompt("summarize_book", {"book_id": "12", "style": "concise"}))
            got = [m.get("content", {}).get("text") for m in result.get("messages", [])]
            expect(
                "prompts/get fills the arguments in",
                got[:1] == ["Summarize the book library://books/12 in a concise style."],
                ["Summarize the book library://books/12 in a concise style."],
                got,
            )

            before = len(posts)
            result = wire(await c.call_tool("test_elicitation", {"message": "Who are you?"}))
            text = single_text("tools/call test_elicitation (MRTR)", result)
            expect(
                "the elicitation callback was asked once, with the tool's message",
                len(asked) == 1 and asked[0].message == "Who are you?",
                ["Who are you?"],
                [a.message for a in asked],
            )
            expect(
                "the tool got the callback's answer",
                "action=accept" in text and "ada@example.com" in text,
                "User response: action=accept, content={...ada@example.com...}",
                text,
            )
            calls = [(m, status, body.get("params", {})) for m, status, _, _, body in posts[before:]]
            expect(
                "MRTR: two tools/call POSTs, the retry carrying inputResponses",
                len(calls) == 2
                and all(m == "tools/call" and s == 200 for m, s, _ in calls)
                and "inputResponses" not in calls[0][2]
                and "elicitation" in calls[1][2].get("inputResponses", {}),
                ["tools/call", "tools/call + inputResponses.elicitation"],
                calls,
            )

            # Two questions in turn, the first answer kept in the router's
            # state: the broker seals it into requestState, which the SDK
            # echoes byte-exact on each retry.
            before = len(posts)
            result = wire(await c.call_tool("test_input_required_result_multi_round", {}))
            text = single_text("tools/call test_input_required_result_multi_round", result)
            expect(
                "the tool's state carried the first answer to the last round",
                text == "Hello, Ada! Your colour: blue",
                "Hello, Ada! Your colour: blue",
                text,
            )
            calls = [body.get("params", {}) for m, _, _, _, body in posts[before:] if m == "tools/call"]
            states = [p.get("requestState") for p in calls]
            expect(
                "three POSTs, each retry echoing the requestState of the round before",
                len(calls) == 3
                and states[0] is None
                and all(isinstance(s, str) and s for s in states[1:])
                and states[1] != states[2],
                [None, "<token 1>", "<token 2>"],
                states,
            )

            # The tool asks for the client's roots: a roots/list input
            # request under the key it names, which the SDK answers from its
            # callback on the retry.
            before = len(posts)
            result = wire(await c.call_tool("test_input_required_result_list_roots", {}))
            text = single_text("tools/call test_input_required_result_list_roots", result)
            expect("the tool got the callback's roots", text == "Roots: file:///work/project", "Roots: file:///work/project", text)
            calls = [body.get("params", {}) for m, _, _, _, body in posts[before:] if m == "tools/call"]
            expect(
                "two POSTs, the retry answering client_roots",
                len(calls) == 2 and "client_roots" in calls[1].get("inputResponses", {}),
                ["tools/call", "tools/call + inputResponses.client_roots"],
                calls,
            )

            # Three questions at once: one InputRequiredResult, which the
            # SDK answers from its three callbacks in a single retry.
            before = len(posts)
            result = wire(await c.call_tool("test_input_required_result_multiple_inputs", {}))
            text = single_text("tools/call test_input_required_result_multiple_inputs", result)
            want = "Hello, Ada! Greeting: Hi there. Roots: 1"
            expect("the tool got the three callbacks' answers", text == want, want, text)
            calls = [body.get("params", {}) for m, _, _, _, body in posts[before:] if m == "tools/call"]
            answered = sorted(calls[1].get("inputResponses", {})) if len(calls) == 2 else []
            expect(
                "two POSTs, the retry answering every key, with the requestState",
                answered == ["client_roots", "greeting", "user_name"]
                and isinstance(calls[1].get("requestState"), str),
                ["client_roots", "greeting", "user_name"],
                calls,
            )

            if reload_url is not None:
                # subscriptions/listen: acknowledged (what is honoured: kv
                # tells its writes, no router serves x://y), then
                # resources/updated for a kv write, then tools/list_changed
                # when a reload (the test rewrote the config) adds tools.
                async with c.listen(
                    tools_list_changed=True, resource_subscriptions=["x://y", "kv://sdk2"]
                ) as sub:
                    honored = wire(sub.honored)
                    want = {"toolsListChanged": True, "resourceSubscriptions": ["kv://sdk2"]}
                    expect("listen acknowledged toolsListChanged and kv://sdk2", honored == want, want, honored)
                    result = wire(await c.call_tool("put", {"key": "sdk2", "value": 1}))
                    expect("kv put", result.get("isError") is False, {"isError": False}, result)
                    with anyio.fail_after(10):
                        event = await sub.__anext__()
                    expect(
                        "the listen stream got resources/updated for kv://sdk2",
                        event == ResourceUpdated(uri="kv://sdk2"),
                        "ResourceUpdated(uri='kv://sdk2')",
                        repr(event),
                    )
                    async with httpx2.AsyncClient() as admin:
                        r = await admin.post(reload_url)
                    expect("POST /admin/reload applied", r.status_code == 200, 200, r.status_code)
                    with anyio.fail_after(10):
                        event = await sub.__anext__()
                    expect(
                        "the listen stream got tools/list_changed",
                        isinstance(event, ToolsListChanged),
                        "ToolsListChanged",
                        repr(event),
                    )

            expect(
                "every request carried Mcp-Method and MCP-Protocol-Version",
                all(h.get("mcp-method") == m and h.get("mcp-protocol-version") == MODERN for m, _, h, _, _ in posts),
                "mcp-method and mcp-protocol-version on every POST",
                [(m, h.get("mcp-method"), h.get("mcp-protocol-version")) for m, _, h, _, _ in posts],
            )
            expect(
                "no answer minted or echoed a session",
                all("mcp-session-id" not in rh for _, _, _, rh, _ in posts),
                "no Mcp-Session-Id",
                [rh.get("mcp-session-id") for _, _, _, rh, _ in posts],
            )

    print("sdk2-modern client: ok", flush=True)


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    url = sys.argv[1]
    reload_url = sys.argv[2] if len(sys.argv) == 3 else None
    print(f"mcp {importlib.metadata.version('mcp')} -> {url}", flush=True)
    return checked("sdk2-modern", run(url, reload_url))


if __name__ == "__main__":
    sys.exit(main())
