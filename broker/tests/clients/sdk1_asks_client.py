"""The Python `mcp` SDK 1.x `ClientSession`, answering what the broker asks
on a request's stream in the session-based revisions: elicitation, sampling
and the client's roots, from its own callbacks.

Against the `conformance` router's tools (the broker must serve it:
broker/tests/http_clients.rs starts it so):
- `test_input_required_result_multi_round` asks two questions in turn; the
  router's state (`mcp-broker/state`) is held by the stream between them;
- `test_input_required_result_sampling` asks for a completion;
- `test_input_required_result_list_roots` asks for the roots;
- `test_input_required_result_multiple_inputs` asks a set of three at once
  (`mcp-broker/input-requests`), which the broker sends in turn and hands
  back to the tool together.

Usage: .tools/mcp1/bin/python sdk1_asks_client.py http://127.0.0.1:PORT/mcp
Prints one `ok:` line per check and `sdk1-asks client: ok` at the end;
exits 1 with the failed step, the expected and the received value
otherwise.
"""

from __future__ import annotations

import importlib.metadata
import sys
import warnings
from typing import Any

from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client

from scenario import Mismatch, checked, expect, single_text, wire

warnings.simplefilter("ignore", DeprecationWarning)


async def run(url: str) -> None:
    # What each callback was asked, in order: (kind, detail).
    asked: list[tuple[str, str]] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(("elicitation", params.message))
        if "colour" in params.message:
            return types.ElicitResult(action="accept", content={"color": "blue"})
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def on_sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        first = params.messages[0].content
        asked.append(("sampling", getattr(first, "text", "")))
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="Hi there"), model="sdk1-test"
        )

    async def on_list_roots(context: Any) -> types.ListRootsResult:
        asked.append(("roots", ""))
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/project", name="Project")])

    async with streamablehttp_client(url, timeout=20) as (read, write, session_id):
        async with ClientSession(
            read,
            write,
            sampling_callback=on_sample,
            elicitation_callback=on_elicit,
            list_roots_callback=on_list_roots,
        ) as s:
            init = await s.initialize()
            if not session_id():
                raise Mismatch("initialize: the server issued no Mcp-Session-Id")
            print(f"ok: initialized on {init.protocolVersion}", flush=True)

            asked.clear()
            text = single_text(
                "test_input_required_result_multi_round",
                wire(await s.call_tool("test_input_required_result_multi_round", {})),
            )
            expect("two questions in turn, the first answer kept in the state", text == "Hello, Ada! Your colour: blue", "Hello, Ada! Your colour: blue", text)
            expect("the elicitation callback was asked twice", [k for k, _ in asked] == ["elicitation"] * 2, ["elicitation"] * 2, asked)

            asked.clear()
            text = single_text(
                "test_input_required_result_sampling",
                wire(await s.call_tool("test_input_required_result_sampling", {})),
            )
            expect("the sampling callback's text reached the tool", text == "LLM response: Hi there", "LLM response: Hi there", text)
            expect(
                "the sampling callback got the tool's prompt",
                asked == [("sampling", "What is the capital of France?")],
                [("sampling", "What is the capital of France?")],
                asked,
            )

            asked.clear()
            text = single_text(
                "test_input_required_result_list_roots",
                wire(await s.call_tool("test_input_required_result_list_roots", {})),
            )
            expect("the roots callback's roots reached the tool", text == "Roots: file:///work/project", "Roots: file:///work/project", text)

            asked.clear()
            text = single_text(
                "test_input_required_result_multiple_inputs",
                wire(await s.call_tool("test_input_required_result_multiple_inputs", {})),
            )
            want = "Hello, Ada! Greeting: Hi there. Roots: 1"
            expect("a set of three questions, answered together", text == want, want, text)
            expect(
                "each callback asked once, in the set's order",
                [k for k, _ in asked] == ["roots", "sampling", "elicitation"],
                ["roots", "sampling", "elicitation"],
                asked,
            )


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    url = sys.argv[1]
    print(f"mcp {importlib.metadata.version('mcp')} -> {url}", flush=True)
    if checked("sdk1-asks", run(url)):
        return 1
    print("sdk1-asks client: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
