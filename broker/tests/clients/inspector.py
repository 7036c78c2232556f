"""MCP Inspector's CLI (`mcp-inspector --cli URL --transport http`) against an
MCP Streamable HTTP endpoint serving the bundled routers.

Usage: python3 inspector.py http://127.0.0.1:PORT/mcp
Runs tools/list (also after a `server/discover` probe), tools/call (arguments as `--tool-arg k=v` and as
`--tool-args-json`), resources/list, resources/templates/list,
resources/read, prompts/list and prompts/get, and checks each JSON answer.
Prints one `ok:` line per check and `inspector client: ok` at the end;
exits 1 with the failed step and the CLI's output otherwise.

Every `--method` is its own process, hence its own MCP session
(initialize ... DELETE): `kv` state cannot outlive one invocation, so this
script checks that a key put by one invocation is absent in the next (each
session has its own kv instance), and the SDK clients check that state
persists within a session.

The CLI comes from tools/node (`scripts/setup`) and runs on the Node in
.tools/node; MCP_INSPECTOR and MCP_NODE_BIN override them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
INSPECTOR = Path(os.environ.get("MCP_INSPECTOR", ROOT / "tools/node/node_modules/.bin/mcp-inspector"))
NODE_BIN = Path(os.environ.get("MCP_NODE_BIN", ROOT / ".tools/node/bin"))
BUNDLED_TOOLS = {"echo", "echo_text", "put", "get", "delete", "list", "search"}
TIMEOUT_S = 60


class Mismatch(Exception):
    pass


def expect(step: str, ok: bool, expected: Any, got: Any) -> None:
    if not ok:
        raise Mismatch(
            f"{step}: expected {json.dumps(expected, sort_keys=True)}\n"
            f"  got {json.dumps(got, sort_keys=True, default=str)}"
        )
    print(f"ok: {step}", flush=True)


class Inspector:
    def __init__(self, url: str, home: str):
        self.url = url
        # The CLI keeps a catalog and client state under $HOME: a throwaway
        # home keeps runs independent of each other and of the user's.
        self.env = dict(os.environ, HOME=home, PATH=f"{NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [
            str(INSPECTOR), "--cli", self.url, "--transport", "http",
            "--format", "json", "--stored-auth-only", "--connect-timeout", "15000", *args,
        ]  # fmt: skip
        try:
            return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise Mismatch(f"{' '.join(args)}: the CLI did not finish within {TIMEOUT_S} s\n  stdout: {e.stdout}\n  stderr: {e.stderr}")

    def result(self, *args: str) -> dict[str, Any]:
        """The `result` of a call that must succeed."""
        p = self.run(*args)
        try:
            out = json.loads(p.stdout)
        except ValueError:
            out = None
        if p.returncode != 0 or not isinstance(out, dict) or "result" not in out:
            raise Mismatch(
                f"{' '.join(args)}: the CLI failed (exit {p.returncode})\n  stdout: {p.stdout}\n  stderr: {p.stderr}"
            )
        return out["result"]


def single_text(step: str, result: dict[str, Any]) -> str:
    content = result.get("content", [])
    expect(
        f"{step} answers one text block",
        not result.get("isError") and len(content) == 1 and content[0].get("type") == "text",
        {"isError": False, "content": [{"type": "text", "text": "..."}]},
        result,
    )
    return content[0]["text"]


def scenario(cli: Inspector) -> None:
    tools = cli.result("--method", "tools/list")
    names = {t["name"] for t in tools.get("tools", [])}
    expect("tools/list has the bundled tools", BUNDLED_TOOLS <= names, sorted(BUNDLED_TOOLS), sorted(names))

    # `--protocol-era auto` makes the CLI's TypeScript SDK probe
    # `server/discover` first, as 2.x Python does; the broker answers it
    # (it serves 2026-07-28), and the listing works in whichever revision
    # the CLI then speaks.
    tools = cli.result("--method", "tools/list", "--protocol-era", "auto")
    names = {t["name"] for t in tools.get("tools", [])}
    expect("tools/list after the server/discover probe", BUNDLED_TOOLS <= names, sorted(BUNDLED_TOOLS), sorted(names))

    # `--tool-arg` coerces numbers and JSON values; the echo answers them back.
    r = cli.result("--method", "tools/call", "--tool-name", "echo",
                   "--tool-arg", "greeting=héllo", "n=3", 'nested={"ok":true}')  # fmt: skip
    want = {"greeting": "héllo", "n": 3, "nested": {"ok": True}}
    text = single_text("tools/call echo --tool-arg", r)
    expect("echo's text is its arguments", json.loads(text) == want, want, text)
    expect("echo's structuredContent is its arguments", r.get("structuredContent") == want, want, r)

    args = {"greeting": "with = and spaces", "nested": {"list": [1, 2.5, None]}}
    r = cli.result("--method", "tools/call", "--tool-name", "echo", "--tool-args-json", json.dumps(args))
    expect("echo with --tool-args-json", r.get("structuredContent") == args, args, r)

    r = cli.result("--method", "tools/call", "--tool-name", "echo_text", "--tool-arg", "text=from inspector")
    text = single_text("tools/call echo_text", r)
    expect("echo_text answers its text", text == "from inspector", "from inspector", text)

    r = cli.result("--method", "tools/call", "--tool-name", "search", "--tool-arg", "query=programming")
    links = sorted(c.get("uri", "") for c in r.get("content", []) if c.get("type") == "resource_link")
    want_links = ["library://books/12", "library://books/3"]
    expect("library search answers resource links", links == want_links, want_links, r)

    # kv: the put succeeds; the next invocation is a new session, with its
    # own (empty) kv instance, so the key is not there.
    key = f"inspector-{uuid.uuid4().hex[:8]}"
    r = cli.result("--method", "tools/call", "--tool-name", "put", "--tool-args-json",
                   json.dumps({"key": key, "value": {"from": "inspector"}}))  # fmt: skip
    expect(
        "kv put",
        r.get("structuredContent") == {"key": key, "replaced": False},
        {"structuredContent": {"key": key, "replaced": False}},
        r,
    )
    # A missing key is the tool's own failure: a result with isError (MCP
    # 2025-11-25), whose text names the key.
    p = cli.run("--method", "tools/call", "--tool-name", "get", "--tool-arg", f"key={key}")
    # (The CLI prints the result and exits non-zero for an isError result.)
    try:
        got = json.loads(p.stdout).get("result", {})
    except ValueError:
        got = {}
    expect(
        "kv get in a new invocation (a new session) does not find the key",
        p.returncode != 0 and got.get("isError") is True and key in p.stdout,
        "an isError result naming the key",
        {"exit": p.returncode, "stdout": p.stdout, "stderr": p.stderr},
    )

    r = cli.result("--method", "resources/list")
    uris = {x.get("uri") for x in r.get("resources", [])}
    expect("resources/list has library://readme", "library://readme" in uris, ["library://readme"], sorted(map(str, uris)))
    r = cli.result("--method", "resources/templates/list")
    templates = {x.get("uriTemplate") for x in r.get("resourceTemplates", [])}
    expect("resources/templates/list has the book template", "library://books/{id}" in templates, ["library://books/{id}"], r)

    r = cli.result("--method", "resources/read", "--uri", "library://readme")
    c = r.get("contents", [])
    expect(
        "resources/read library://readme",
        len(c) == 1 and c[0].get("text", "").startswith("# Library"),
        {"contents": [{"text": "# Library..."}]},
        r,
    )
    r = cli.result("--method", "resources/read", "--uri", "library://books/12")
    c = r.get("contents", [])
    book = json.loads(c[0]["text"]) if len(c) == 1 and "text" in c[0] else None
    want_book = {"id": "12", "title": "Programming Rust", "author": "Blandy, Orendorff, Tindall"}
    expect("resources/read library://books/12 (templated)", book == want_book, want_book, r)

    r = cli.result("--method", "prompts/list")
    names = {x.get("name") for x in r.get("prompts", [])}
    want_prompts = {"summarize_book", "compare_books"}
    expect("prompts/list has the library prompts", want_prompts <= names, sorted(want_prompts), sorted(map(str, names)))
    r = cli.result("--method", "prompts/get", "--prompt-name", "summarize_book",
                   "--prompt-args", "book_id=12", "style=concise")  # fmt: skip
    got = [[m.get("role"), m.get("content", {}).get("text")] for m in r.get("messages", [])]
    want_msgs = [
        ["user", "Summarize the book library://books/12 in a concise style."],
        ["assistant", "I will read library://books/12 first."],
    ]
    expect("prompts/get fills the arguments in", got == want_msgs, want_msgs, r)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    for path, what in ((INSPECTOR, "MCP Inspector"), (NODE_BIN / "node", "Node")):
        if not path.exists():
            print(f"inspector client: FAILED: {what} is not installed at {path}: run scripts/setup", file=sys.stderr)
            return 1
    print(f"{INSPECTOR} -> {sys.argv[1]}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mcp-inspector-home-") as home:
        try:
            scenario(Inspector(sys.argv[1], home))
        except Mismatch as e:
            sys.stdout.flush()
            print(f"inspector client: FAILED: {e}", file=sys.stderr)
            return 1
    print("inspector client: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
