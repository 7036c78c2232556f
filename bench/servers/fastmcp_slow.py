"""A FastMCP (PyPI `mcp` 1.x) Streamable HTTP server whose one tool sleeps,
for `bench/upstream.py`: how many slow upstream calls one broker shard holds
at once.

    python bench/servers/fastmcp_slow.py PORT [--json]

PORT 0 picks a free port. Prints one line once it accepts connections:

    fastmcp-slow ready http=127.0.0.1:PORT path=/mcp

Tool:
- `sleep_ms(ms)`: waits `ms` milliseconds (asyncio, so any number of calls
  wait at once on the one event loop), then returns "slept ms" as text.
"""

import argparse
import asyncio

from uvicorn_launch import run_uvicorn  # the same directory: one launcher
from mcp.server.fastmcp import FastMCP


def build(json_response: bool) -> FastMCP:
    server = FastMCP(
        "slow",
        instructions="`sleep_ms` answers after the given number of milliseconds.",
        json_response=json_response,
        log_level="WARNING",
    )

    @server.tool(name="sleep_ms", description="Sleeps `ms` milliseconds, then answers.")
    async def sleep_ms(ms: int) -> str:
        await asyncio.sleep(ms / 1000)
        return f"slept {ms}"

    return server


async def serve(port: int, json_response: bool) -> None:
    await run_uvicorn(build(json_response).streamable_http_app(), port, "fastmcp-slow")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("port", type=int)
    p.add_argument("--json", action="store_true", help="answer with application/json, not SSE")
    a = p.parse_args()
    asyncio.run(serve(a.port, a.json))


if __name__ == "__main__":
    main()
