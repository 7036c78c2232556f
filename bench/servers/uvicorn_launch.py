"""One uvicorn launcher for every Python MCP server of the repository, of
either SDK generation (FastMCP in `mcp` 1.x, MCPServer in 2.x): it imports
neither, so both venvs can use it. Used by `fastmcp_echo.py`,
`fastmcp_slow.py` and the broker's upstream test fixtures
(`broker/tests/upstreams/server.py`, `server2.py`)."""

import asyncio
import socket
import sys
from typing import Any

import uvicorn


async def run_uvicorn(
    app: Any, port: int, label: str, fd: int | None = None, **tls: Any
) -> None:
    """Serves `app` on 127.0.0.1:`port` (0: any) and prints
    `LABEL ready http=127.0.0.1:PORT path=/mcp` once it accepts connections.
    `fd`: an inherited TCP socket, already bound and not yet listening, to
    serve on instead of `port` (the tests hold a port that way so no one
    else can take it); `tls`: uvicorn's `ssl_certfile`/`ssl_keyfile`."""
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
