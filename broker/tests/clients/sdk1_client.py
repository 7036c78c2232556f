"""The Python `mcp` SDK 1.x (`streamablehttp_client` + `ClientSession`)
against an MCP Streamable HTTP endpoint serving the bundled routers.

Usage: .tools/mcp1/bin/python sdk1_client.py http://127.0.0.1:PORT/mcp
Prints one `ok:` line per check and `sdk1 client: ok` at the end; exits 1
with the failed step, the expected and the received value otherwise.
"""

from __future__ import annotations

import importlib.metadata
import sys
import warnings
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client

import scenario
from scenario import Mismatch

# 1.x deprecates `streamablehttp_client` for `streamable_http_client`; the
# old name is what 1.x users' code calls, so it is the one tested.
warnings.simplefilter("ignore", DeprecationWarning)


class Sdk1Session:
    def __init__(self, session: ClientSession, init: types.InitializeResult):
        self.s = session
        self.protocol_version = str(init.protocolVersion)
        self.server_name = init.serverInfo.name

    async def ping(self) -> None:
        await self.s.send_ping()

    async def list_tools(self, cursor: str | None) -> Any:
        return await self.s.list_tools(params=types.PaginatedRequestParams(cursor=cursor))

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self.s.call_tool(name, arguments)

    async def list_resources(self, cursor: str | None) -> Any:
        return await self.s.list_resources(params=types.PaginatedRequestParams(cursor=cursor))

    async def list_resource_templates(self, cursor: str | None) -> Any:
        return await self.s.list_resource_templates(params=types.PaginatedRequestParams(cursor=cursor))

    async def read_resource(self, uri: str) -> Any:
        return await self.s.read_resource(uri)

    async def list_prompts(self, cursor: str | None) -> Any:
        return await self.s.list_prompts(params=types.PaginatedRequestParams(cursor=cursor))

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> Any:
        return await self.s.get_prompt(name, arguments)

    async def complete_prompt_argument(self, prompt: str, argument: str, value: str) -> Any:
        return await self.s.complete(
            types.PromptReference(type="ref/prompt", name=prompt), {"name": argument, "value": value}
        )


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    url = sys.argv[1]

    @asynccontextmanager
    async def connect() -> AsyncIterator[Sdk1Session]:
        async with streamablehttp_client(url, timeout=20) as (read, write, session_id):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                if not session_id():
                    raise Mismatch("initialize: the server issued no Mcp-Session-Id")
                yield Sdk1Session(session, init)

    print(f"mcp {importlib.metadata.version('mcp')} -> {url}", flush=True)
    return scenario.main("sdk1", connect)

if __name__ == "__main__":
    sys.exit(main())
