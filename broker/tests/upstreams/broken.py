"""A deliberately broken MCP upstream for the broker's failure tests
(`broker/tests/upstream.rs`): it initializes and lists one tool, `boom`,
properly, then answers `tools/call` badly, in the way its path names:

- `/garbage`: 200 `application/json` whose body is not JSON;
- `/drop`: 200 `text/event-stream` with one progress event, then the
  connection closes before the response;
- `/status500`: HTTP 500 with a text body;
- `/wrongid`: a JSON-RPC response for another request id, then the end;
- `/hang`: answers `tools/call` after 10 s (past a short call deadline);
- `/silent`: answers `initialize`, then opens an SSE answer to
  `tools/list` and never writes to it (an upstream that hangs at start-up);
- `/as/NAME`: lists the tool NAME instead of `boom` (a listing that
  collides with another router's qualified name);
- `/many/N`: lists N tools `t0`…, besides `boom` (a listing of many pages);
- `/forge`: answers `initialize` with HTTP 500 and a body that would forge
  a log line (a newline, a fake timestamp, a terminal escape).

Every path counts the `notifications/cancelled` it receives, and the
session ends (`DELETE` of a `broken-session-N` it gave); the methods
`test/cancelled` and `test/deleted` answer the counts (`{"count": N}`)
for the path asked. Like a server that forgets a deleted session, a
cancellation in a session already ended is answered 404 and not counted;
and it takes a moment (0.2 s) over each, so that one sent beside its
session's DELETE, not before it, finds the session ended.

    python broken.py PORT

Prints `broken-upstream ready http=127.0.0.1:PORT` once it listens. The
standard library only: the point is a server no SDK would let us write.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CANCELLED = {}
DELETED = {}
# Session ids a DELETE ended; SESSIONS numbers the ones given.
ENDED = set()
SESSIONS = [0]
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type="application/json", headers=()):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(405, "", "text/plain")

    def do_DELETE(self):
        # A session's end: counted by path, answered as servers that allow
        # it do.
        sid = self.headers.get("Mcp-Session-Id", "")
        if sid.startswith("broken-session-"):
            with LOCK:
                DELETED[self.path] = DELETED.get(self.path, 0) + 1
                ENDED.add(sid)
            self.reply(200, "", "text/plain")
        else:
            self.reply(404, "", "text/plain")

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        msg = json.loads(self.rfile.read(n) or b"{}")
        method = msg.get("method", "")
        if "id" not in msg:
            if method == "notifications/cancelled":
                time.sleep(0.2)
                with LOCK:
                    ended = self.headers.get("Mcp-Session-Id") in ENDED
                    if not ended:
                        CANCELLED[self.path] = CANCELLED.get(self.path, 0) + 1
                if ended:
                    self.reply(404, "", "text/plain")
                    return
            self.reply(202, "", "text/plain")
            return
        rid = msg["id"]

        def result(r):
            return json.dumps({"jsonrpc": "2.0", "id": rid, "result": r})

        if method == "initialize" and self.path.strip("/") == "forge":
            self.reply(500, "can't \"serve\": down\n2026-12-07T00:00:00.000000Z ERROR mcp_broker: forged\x1b[2J", "text/plain")
        elif method == "initialize":
            with LOCK:
                SESSIONS[0] += 1
                sid = f"broken-session-{SESSIONS[0]}"
            self.reply(
                200,
                result(
                    {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "broken", "version": "1"},
                    }
                ),
                headers=[("Mcp-Session-Id", sid)],
            )
        elif method == "test/cancelled":
            with LOCK:
                n = CANCELLED.get(self.path, 0)
            self.reply(200, result({"count": n}))
        elif method == "test/deleted":
            with LOCK:
                n = DELETED.get(self.path, 0)
            self.reply(200, result({"count": n}))
        elif method == "tools/list" and self.path.strip("/") == "silent":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.flush()
            time.sleep(60)
            self.close_connection = True
        elif method == "tools/list":
            name = self.path[len("/as/"):] if self.path.startswith("/as/") else "boom"
            many = []
            if self.path.startswith("/many/"):
                many = [
                    {"name": f"t{i}", "inputSchema": {"type": "object"}}
                    for i in range(int(self.path[len("/many/"):]))
                ]
            self.reply(
                200,
                result(
                    {
                        "tools": many
                        + [
                            {
                                "name": name,
                                "description": "Answered badly.",
                                "inputSchema": {"type": "object"},
                            }
                        ]
                    }
                ),
            )
        elif method == "tools/call":
            mode = self.path.strip("/")
            if mode == "garbage":
                self.reply(200, "this is not { json")
            elif mode == "status500":
                self.reply(500, "upstream exploded", "text/plain")
            elif mode == "hang":
                time.sleep(10)
                self.reply(200, result({"content": []}))
            elif mode == "wrongid":
                self.reply(200, json.dumps({"jsonrpc": "2.0", "id": 424242, "result": {}}))
            else:  # drop
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                progress = {
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {"progressToken": rid, "progress": 1},
                }
                self.wfile.write(f"event: message\ndata: {json.dumps(progress)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True
        else:
            self.reply(
                200,
                json.dumps(
                    {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}}
                ),
            )


def main():
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print(f"broken-upstream ready http=127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
