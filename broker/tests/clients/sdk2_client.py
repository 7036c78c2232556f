"""The Python `mcp` SDK 2.x (`mcp.Client`) against an MCP Streamable HTTP
endpoint serving the bundled routers.

`Client` in its default mode (`auto`) first probes `server/discover` (the
2026-07-28 revision) and falls back to `initialize` when the server refuses
the probe. This script checks that exchange on the wire for every session it
opens: the probe is answered with an HTTP 4xx, then `initialize` succeeds
and a handshake-era protocol version is negotiated.

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
        # (JSON-RPC method, HTTP status) of every POST, in order.
        posts: list[tuple[str, int]] = []

        async def record(response: httpx2.Response) -> None:
            if response.request.method == "POST":
                try:
                    method = json.loads(response.request.content).get("method", "(response)")
                except (ValueError, AttributeError):
                    method = "(unparsed)"
                posts.append((method, response.status_code))

        http = create_mcp_http_client()
        http.event_hooks["response"].append(record)
        async with http:
            async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=20) as client:
                probe = posts[0] if posts else None
                if probe is None or probe[0] != "server/discover" or not 400 <= probe[1] < 500:
                    raise Mismatch(
                        "connect: expected the server/discover probe first, answered with an HTTP 4xx\n"
                        f"  got POSTs {posts}"
                    )
                if [m for m, _ in posts[1:2]] != ["initialize"] or posts[1][1] != 200:
                    raise Mismatch(f"connect: expected initialize (200) after the refused probe\n  got POSTs {posts}")
                if client.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
                    raise Mismatch(
                        f"connect: expected a handshake-era protocol after the fallback, "
                        f"got {client.protocol_version!r}"
                    )
                print(f"ok: server/discover refused with HTTP {probe[1]}, fell back to initialize", flush=True)
                yield Sdk2Session(client)

    print(f"mcp {importlib.metadata.version('mcp')} -> {url}", flush=True)
    return scenario.main("sdk2", connect)


if __name__ == "__main__":
    sys.exit(main())
