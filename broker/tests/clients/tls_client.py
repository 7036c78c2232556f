"""The Python `mcp` SDK 1.x over https:// with a bearer token: the broker
with [tls] and [auth] (broker/tests/tls.rs).

Usage: .tools/mcp1/bin/python tls_client.py https://localhost:PORT/mcp CA_PEM TOKEN
Prints `tls client: ok` at the end; exits 1 naming the failed step.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import warnings

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

warnings.simplefilter("ignore", DeprecationWarning)


def fail(step: str, detail: object) -> None:
    print(f"FAILED {step}: {detail}")
    sys.exit(1)


async def main() -> None:
    url, ca, token = sys.argv[1:4]
    # Only the test's CA is trusted: a broker certificate it did not sign
    # fails the run.
    context = ssl.create_default_context(cafile=ca)

    def factory(headers=None, timeout=None, auth=None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers=headers,
            timeout=timeout or httpx.Timeout(30, read=300),
            auth=auth,
            verify=context,
        )

    headers = {"Authorization": f"Bearer {token}"}
    async with streamablehttp_client(url, headers=headers, httpx_client_factory=factory) as (r, w, _):
        async with ClientSession(r, w) as s:
            init = await s.initialize()
            if init.serverInfo.name != "mcp-broker":
                fail("initialize", init)
            tools = await s.list_tools()
            names = {t.name for t in tools.tools}
            if "echo_text" not in names:
                fail("tools/list", sorted(names))
            res = await s.call_tool("echo_text", {"text": "over tls"})
            text = res.content[0].text if res.content else None
            if res.isError or text != "over tls":
                fail("tools/call echo_text", res)
            print("ok: initialize, tools/list and tools/call over https with a bearer token")

    # Without the token the broker answers 401 before any MCP exchange.
    async with factory() as client:
        r = await client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                              headers={"Accept": "application/json, text/event-stream"})
        if r.status_code != 401 or "resource_metadata" not in r.headers.get("www-authenticate", ""):
            fail("no token", (r.status_code, dict(r.headers)))
        print("ok: no token is 401 with resource_metadata")

    # A client that does not trust the broker's CA refuses the connection.
    try:
        async with httpx.AsyncClient(verify=ssl.create_default_context()) as client:
            await client.post(url, json={})
        fail("untrusted CA", "the connection succeeded")
    except httpx.ConnectError as e:
        if "CERTIFICATE_VERIFY_FAILED" not in str(e):
            fail("untrusted CA", e)
        print("ok: a client without the CA refuses the certificate")
    print("tls client: ok")


asyncio.run(main())
