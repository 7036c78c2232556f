"""A FastMCP (PyPI `mcp` 1.x) Streamable HTTP server for the broker's
upstream-router tests (`broker/tests/upstream.rs`).

    python server.py PORT --name NAME [--fd FD] [--json] [--state DIR] [--tls CERT KEY]

PORT 0 picks a free port. Prints one line once it accepts connections:

    upstream-fixture ready http=127.0.0.1:PORT path=/mcp

Two instances with different NAMEs serve the same tool, resource-template
and prompt names (so that the broker must qualify them) plus tools of their
own. `--state DIR` keeps what the tests check across a restart (the count
of cancelled calls) in files there.

Tools:
- `add(a, b)`: a + b, as text.
- `whoami()`: the server's NAME and the `Authorization` header it received
  (the no-token-passthrough test reads it).
- `peer()`: the client port of the TCP connection the call arrived on
  (the connection-reuse test reads it).
- `steps(n, delay=0.01, open_ended=False)`: reports progress 1..n of n
  (with no total when `open_ended`) and logs one message
  per step, `delay` seconds apart, then returns "done n"; a cancelled
  call is counted in DIR/cancelled.
- `slow(seconds)`: sleeps, then returns "slept"; a cancelled call is
  counted in DIR/cancelled.
- `cancelled()`: that count.
- `steps_aside(n, delay=0.01)`: as `steps`, but its progress and logs are
  sent unrelated to the request, so on the session's GET stream, as
  FastMCP releases before 1.30 send `report_progress`.
- `ask_aside()`: asks the client for a sampling unrelated to the request
  (on the GET stream) and returns what came back, or the error's text.
- `grow()`: adds a tool `grown_N` and announces `tools/list_changed` on
  the call's own stream.
- `fail()`: raises, which FastMCP returns as an `isError` result.
- `<NAME>_only()`: exists on one server only.
Resources: `fixture://NAME/about` (text); template `greeting://NAME/{who}`.
Prompt: `greet(who)` -> "Hello, {who}, from NAME!".
"""

import argparse
import asyncio
import os
import sys
from pathlib import Path

from mcp import types
from mcp.server.fastmcp import Context, FastMCP

# One uvicorn launcher for every FastMCP server of the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench" / "servers"))
from uvicorn_launch import run_uvicorn  # noqa: E402


def build(name: str, json_response: bool, state: str | None) -> FastMCP:
    server = FastMCP(
        name,
        instructions=f"The {name} test upstream.",
        json_response=json_response,
        log_level="WARNING",
    )
    grown = {"n": 0}

    def bump_cancelled() -> None:
        if state:
            path = os.path.join(state, "cancelled")
            n = int(open(path).read()) if os.path.exists(path) else 0
            with open(path, "w") as f:
                f.write(str(n + 1))

    @server.tool(description="Adds two integers.")
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="Who answered, and the Authorization header it saw.")
    def whoami(ctx: Context) -> str:
        request = ctx.request_context.request
        auth = request.headers.get("authorization", "") if request is not None else ""
        return f"{name} auth={auth}"

    @server.tool(description="The client port of the connection this call came on.")
    def peer(ctx: Context) -> str:
        request = ctx.request_context.request
        return str(request.client.port) if request is not None and request.client else "?"

    @server.tool(description="Reports progress n times, logging each step.")
    async def steps(n: int, ctx: Context, delay: float = 0.01, open_ended: bool = False) -> str:
        try:
            for i in range(1, n + 1):
                await ctx.info(f"step {i} of {n}")
                await ctx.report_progress(i, None if open_ended else n, f"step {i}")
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            bump_cancelled()
            raise
        return f"done {n}"

    @server.tool(description="Reports progress n times on the session's GET stream.")
    async def steps_aside(n: int, ctx: Context, delay: float = 0.01) -> str:
        meta = ctx.request_context.meta
        token = meta.progressToken if meta else None
        for i in range(1, n + 1):
            # No related_request_id: the message goes to the GET stream.
            await ctx.session.send_log_message("info", f"aside {i} of {n}")
            if token is not None:
                await ctx.session.send_progress_notification(token, i, n, f"aside {i}")
            await asyncio.sleep(delay)
        return f"done {n}"

    @server.tool(description="Asks the client for a sampling on the session's GET stream.")
    async def ask_aside(ctx: Context) -> str:
        try:
            r = await ctx.session.create_message(
                messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))],
                max_tokens=8,
            )
            return f"answered: {r.model_dump_json()}"
        except Exception as e:  # the refusal, as McpError
            return f"refused: {e}"

    @server.tool(description="Sleeps, then answers.")
    async def slow(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            bump_cancelled()
            raise
        return "slept"

    @server.tool(description="How many calls of `slow` and `steps` were cancelled.")
    def cancelled() -> str:
        if not state:
            return "0"
        path = os.path.join(state, "cancelled")
        return open(path).read() if os.path.exists(path) else "0"

    @server.tool(description="Adds a tool and announces the change.")
    async def grow(ctx: Context) -> str:
        grown["n"] += 1
        n = grown["n"]

        def grown_tool() -> str:
            return f"grown {n}"

        server.add_tool(grown_tool, name=f"grown_{n}", description=f"Added by grow #{n}.")
        # On the request's own stream (related to it): an upstream router
        # sees what arrives while its call runs, not the GET stream.
        await ctx.session.send_notification(
            types.ServerNotification(types.ToolListChangedNotification()),
            related_request_id=ctx.request_id,
        )
        return f"grown_{n}"

    @server.tool(description="Always fails.")
    def fail() -> str:
        raise ValueError(f"{name} failed on purpose")

    def only() -> str:
        return f"only on {name}"

    server.add_tool(only, name=f"{name}_only", description=f"Served by {name} alone.")

    @server.resource(f"fixture://{name}/about", mime_type="text/plain")
    def about() -> str:
        return f"about {name}"

    @server.resource(f"greeting://{name}/{{who}}", mime_type="text/plain")
    def greeting(who: str) -> str:
        return f"greetings, {who}, from {name}"

    @server.prompt(description="Greets someone.")
    def greet(who: str) -> str:
        return f"Hello, {who}, from {name}!"

    return server


async def serve(
    port: int,
    fd: int | None,
    name: str,
    json_response: bool,
    state: str | None,
    tls: list[str] | None,
) -> None:
    app = build(name, json_response, state).streamable_http_app()
    files = {"ssl_certfile": tls[0], "ssl_keyfile": tls[1]} if tls else {}
    await run_uvicorn(app, port, "upstream-fixture", fd, **files)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("port", type=int)
    p.add_argument("--name", required=True)
    p.add_argument(
        "--fd", type=int, help="serve on this inherited socket, bound and not listening; PORT is ignored"
    )
    p.add_argument("--json", action="store_true", help="answer with application/json, not SSE")
    p.add_argument("--state", help="directory for counts kept across restarts")
    p.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve https with these PEM files")
    a = p.parse_args()
    asyncio.run(serve(a.port, a.fd, a.name, a.json, a.state, a.tls))


if __name__ == "__main__":
    main()
