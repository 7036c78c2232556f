"""The Python `mcp` SDK 2.x (`mcp.Client`) against an MCP Streamable HTTP
endpoint serving the bundled routers.

The broker now serves 2026-07-28 beside the handshake-era revisions, so
`Client` in its default mode (`auto`) adopts 2026-07-28 after its
`server/discover` probe (sdk2_modern_client.py checks that). This script
covers the 2.x SDK on the session-based revisions instead: `mode="legacy"`
forces the `initialize` handshake, and for every session it opens the script
checks on the wire that `initialize` is the first POST (no probe), answered
200 with an `Mcp-Session-Id`, and that a handshake-era version is negotiated;
then the shared scenario runs (ping, kv state within a session, ...).

Usage: .tools/mcp2/bin/python sdk2_client.py http://127.0.0.1:PORT/mcp
Prints one `ok:` line per check and `sdk2 client: ok` at the end; exits 1
with the failed step, the expected and the received value otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import warnings
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

import scenario
from scenario import Mismatch

# `ping` and the other handshake-era methods warn that 2026-07-28 removes
# them; this session negotiated a handshake-era version, where they stand.
warnings.simplefilter("ignore", MCPDeprecationWarning)


class Sdk2Session:
    def __init__(self, client: Client):
        self.c = client
        self.protocol_version = client.protocol_version
        self.server_name = client.server_info.name if client.server_info else "?"

    async def ping(self) -> None:
        await self.c.send_ping()

    # Listings bypass the 2.x response cache: each check must reach the server.
    async def list_tools(self, cursor: str | None) -> Any:
        return await self.c.list_tools(cursor=cursor, cache_mode="bypass")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self.c.call_tool(name, arguments)

    async def list_resources(self, cursor: str | None) -> Any:
        return await self.c.list_resources(cursor=cursor, cache_mode="bypass")

    async def list_resource_templates(self, cursor: str | None) -> Any:
        return await self.c.list_resource_templates(cursor=cursor, cache_mode="bypass")

    async def read_resource(self, uri: str) -> Any:
        return await self.c.read_resource(uri, cache_mode="bypass")

    async def list_prompts(self, cursor: str | None) -> Any:
        return await self.c.list_prompts(cursor=cursor, cache_mode="bypass")

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> Any:
        return await self.c.get_prompt(name, arguments)

    async def complete_prompt_argument(self, prompt: str, argument: str, value: str) -> Any:
        return await self.c.complete(types.PromptReference(name=prompt), {"name": argument, "value": value})


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    url = sys.argv[1]

    @asynccontextmanager
    async def connect() -> AsyncIterator[Sdk2Session]:
        # (JSON-RPC method, HTTP status, whether a session id came back) of
        # every POST, in order.
        posts: list[tuple[str, int, bool]] = []

        async def record(response: httpx2.Response) -> None:
            if response.request.method == "POST":
                try:
                    method = json.loads(response.request.content).get("method", "(response)")
                except (ValueError, AttributeError):
                    method = "(unparsed)"
                posts.append((method, response.status_code, "mcp-session-id" in response.headers))

        http = create_mcp_http_client()
        http.event_hooks["response"].append(record)
        async with http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, read_timeout_seconds=20, mode="legacy") as client:
                if posts[:1] != [("initialize", 200, True)]:
                    raise Mismatch(
                        "connect: expected initialize first, answered 200 with an Mcp-Session-Id\n"
                        f"  got POSTs (method, status, session id issued) {posts}"
                    )
                if client.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
                    raise Mismatch(
                        f"connect: expected a handshake-era protocol in legacy mode, got {client.protocol_version!r}"
                    )
                print(f"ok: legacy mode initialized a session at {client.protocol_version}", flush=True)
                yield Sdk2Session(client)

    print(f"mcp {importlib.metadata.version('mcp')} -> {url}", flush=True)
    return scenario.main("sdk2", connect)


if __name__ == "__main__":
    sys.exit(main())
