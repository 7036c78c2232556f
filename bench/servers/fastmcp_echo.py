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
from typing import Any

from pydantic import ConfigDict

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.utilities.func_metadata import ArgModelBase
from mcp.types import CallToolResult, TextContent

from uvicorn_launch import run_uvicorn


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
