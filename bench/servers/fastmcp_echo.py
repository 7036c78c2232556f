"""A FastMCP (PyPI `mcp` 1.x) Streamable HTTP server with the broker's `echo`
tools, for mcp-loadgen's tests (`loadgen/tests/http.rs`) and for benchmarks
against a stock Python MCP server.

    python bench/servers/fastmcp_echo.py PORT [--json] [--stateless]

PORT 0 picks a free port. `--json` answers POSTs with `application/json`
instead of an SSE stream; `--stateless` gives no `Mcp-Session-Id`. Prints
one line once it accepts connections:

    fastmcp-echo ready http=127.0.0.1:PORT path=/mcp

Tools, as the broker's bundled `echo` router (routers/echo/src/lib.rs)
answers them:
- `echo`: any arguments; returns them as a text block (their JSON text) and
  as `structuredContent`.
- `echo_text`: returns the `text` argument as a text block.
"""

import argparse
import asyncio
import json
import socket
import sys
from typing import Any

import uvicorn
from pydantic import ConfigDict

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.utilities.func_metadata import ArgModelBase
from mcp.types import CallToolResult, TextContent


class AnyArguments(ArgModelBase):
    """FastMCP validates arguments against a model built from the tool's
    signature and drops unknown keys; `echo` takes any object, so its model
    keeps every key and hands them over as one `arguments` dict."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.model_extra or {})}


def build(json_response: bool, stateless: bool) -> FastMCP:
    server = FastMCP(
        "echo",
        instructions="Call `echo` with any JSON object to get it back unchanged; "
        "`echo_text` returns the `text` field.",
        json_response=json_response,
        stateless_http=stateless,
        log_level="WARNING",
    )

    @server.tool(
        name="echo",
        description="Returns its arguments unchanged, as text and as structured content.",
    )
    def echo(arguments: dict[str, Any]) -> CallToolResult:
        text = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structuredContent=arguments,
        )

    @server.tool(name="echo_text", description="Returns the `text` argument as a text block.")
    def echo_text(text: str) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text=text)])

    tool = server._tool_manager.get_tool("echo")
    tool.fn_metadata.arg_model = AnyArguments
    tool.parameters = {"type": "object", "additionalProperties": True}
    return server


async def run_uvicorn(
    app: Any, port: int, label: str, fd: int | None = None, **tls: Any
) -> None:
    """Serves `app` on 127.0.0.1:`port` (0: any) and prints
    `LABEL ready http=127.0.0.1:PORT path=/mcp` once it accepts connections.
    Also used by bench/servers/fastmcp_slow.py and the broker's upstream test
    fixture (broker/tests/upstreams/server.py); `fd`: an inherited TCP socket,
    already bound and not yet listening, to serve on instead of `port` (the
    tests hold a port that way so no one else can take it); `tls`: uvicorn's
    `ssl_certfile`/`ssl_keyfile`."""
    # Bound by uvicorn itself, as `FastMCP.run("streamable-http")` does, so
    # the sockets are set up as a stock deployment's are.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        **tls,
    )
    server = uvicorn.Server(config)
    # asyncio's server calls listen() on a socket it is given.
    sockets = [socket.socket(fileno=fd)] if fd is not None else None
    task = asyncio.create_task(server.serve(sockets=sockets))
    # Ready means accepting: poll uvicorn's flag, bounded, and fail loudly.
    for _ in range(1000):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        if task.done():
            task.result()
        sys.exit(f"{label}: uvicorn did not start within 10 s")
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"{label} ready http=127.0.0.1:{port} path=/mcp", flush=True)
    await task


async def serve(port: int, json_response: bool, stateless: bool) -> None:
    await run_uvicorn(build(json_response, stateless).streamable_http_app(), port, "fastmcp-echo")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("port", type=int)
    p.add_argument("--json", action="store_true", help="answer with application/json, not SSE")
    p.add_argument("--stateless", action="store_true", help="no sessions")
    a = p.parse_args()
    asyncio.run(serve(a.port, a.json, a.stateless))


if __name__ == "__main__":
    main()
