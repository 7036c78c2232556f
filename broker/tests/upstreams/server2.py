"""An MCPServer (PyPI `mcp` 2.x, the successor of FastMCP) Streamable HTTP
server for the broker's upstream-router tests (`broker/tests/upstream.rs`):
it serves protocol 2026-07-28 beside the session-based revisions, as the
2.x SDK does by default.

    python server2.py PORT

PORT 0 picks a free port. Prints one line once it accepts connections:

    upstream2-fixture ready http=127.0.0.1:PORT path=/mcp

Tools:
- `add(a, b)`: a + b.
- `welcome()`: needs the user's name (an elicitation), a greeting from the
  client's model (sampling) and the client's roots, each through the 2.x
  SDK's resolvers (`Resolve(...)` with `Elicit`, `Sample`, `ListRoots`):
  in 2026-07-28 the SDK asks them in one `InputRequiredResult` and resumes
  when the client retries with the answers and its sealed `requestState`;
  then returns "<greeting>, <name>! Roots: <count>".
"""

import asyncio
import sys
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Elicit, ListRoots, MCPServer, Resolve, Sample
from mcp_types import CreateMessageResult, ListRootsResult, SamplingMessage, TextContent
from pydantic import BaseModel

# One uvicorn launcher for every FastMCP server of the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench" / "servers"))
from uvicorn_launch import run_uvicorn  # noqa: E402


class Name(BaseModel):
    name: str


def ask_name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


def ask_greeting() -> Sample:
    return Sample(
        [SamplingMessage(role="user", content=TextContent(type="text", text="Greet me"))],
        max_tokens=20,
    )


def ask_roots() -> ListRoots:
    return ListRoots()


def build() -> MCPServer:
    server = MCPServer("modern-upstream", instructions="The 2.x test upstream.", log_level="WARNING")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return a + b

    @server.tool()
    def welcome(
        name: Annotated[Name, Resolve(ask_name)],
        greeting: Annotated[CreateMessageResult, Resolve(ask_greeting)],
        roots: Annotated[ListRootsResult, Resolve(ask_roots)],
    ) -> str:
        """Welcomes the user by name, with the client's model's greeting."""
        said = greeting.content.text if isinstance(greeting.content, TextContent) else "?"
        return f"{said}, {name.name}! Roots: {len(roots.roots)}"

    return server


async def serve(port: int) -> None:
    await run_uvicorn(build().streamable_http_app(), port, "upstream2-fixture")


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
