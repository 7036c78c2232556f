"""A stock MCP client (PyPI `mcp` 1.x, `ClientSession` over
`streamablehttp_client`) calling an upstream router's slow tool through the
broker, for `broker/tests/upstream.rs`: the upstream's progress must reach
the client's progress callback while the call runs, not with its result.

    python sdk_progress.py http://127.0.0.1:PORT/mcp TOOL

TOOL is the broker's name for the upstream's `steps` tool. Prints
`sdk progress: ok` and exits 0, or names the failed check and exits 1.
"""

import asyncio
import sys
import time

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

STEP = 0.4


async def main(url: str, tool: str) -> None:
    seen: list[tuple[float, float, float | None, str | None]] = []
    t0 = time.monotonic()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((time.monotonic() - t0, progress, total, message))

    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            t0 = time.monotonic()
            result = await session.call_tool(
                tool, {"n": 3, "delay": STEP}, progress_callback=on_progress
            )
            done_at = time.monotonic() - t0
    text = result.content[0].text if result.content else None
    if text != "done 3":
        sys.exit(f"sdk progress: result {text!r}, expected 'done 3'")
    if len(seen) != 3:
        sys.exit(f"sdk progress: {len(seen)} progress callbacks, expected 3: {seen}")
    if not done_at > seen[0][0] + 2 * STEP:
        sys.exit(f"sdk progress: first progress at {seen[0][0]:.3f}s, result at {done_at:.3f}s: not live")
    print(f"ok: progress at {[round(s[0], 3) for s in seen]} s, result at {done_at:.3f} s")
    print("sdk progress: ok")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
