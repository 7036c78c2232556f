"""grpcio (the reference gRPC stack) over TLS with a bearer token: the
broker with [tls] and [auth] (broker/tests/tls.rs). The client is generated
by grpcio-tools from proto/mcp.proto at run time.

Usage: grpc_tls.py HOST:PORT PROTO_DIR OUT_DIR CA_PEM TOKEN
Prints `grpc tls: ok`; exits non-zero naming the first unexpected answer.
"""

import json
import sys

from grpc_tools import protoc


def main() -> None:
    target, proto_dir, out_dir, ca, token = sys.argv[1:6]
    rc = protoc.main(["grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={out_dir}",
                      f"--grpc_python_out={out_dir}", f"{proto_dir}/mcp.proto"])
    if rc != 0:
        sys.exit(f"protoc failed: {rc}")
    sys.path.insert(0, out_dir)
    import grpc
    import mcp_pb2 as pb
    import mcp_pb2_grpc as rpc

    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    # The certificate names localhost; the target is an IP address.
    options = [("grpc.ssl_target_name_override", "localhost")]
    ch = grpc.secure_channel(target, creds, options=options)
    grpc.channel_ready_future(ch).result(timeout=30)
    stub = rpc.McpServiceStub(ch)
    md = [("authorization", f"Bearer {token}")]

    try:
        stub.ListTools(pb.ListToolsRequest(), timeout=30)
        sys.exit("ListTools without a token: expected UNAUTHENTICATED, got success")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAUTHENTICATED:
            sys.exit(f"ListTools without a token: expected UNAUTHENTICATED, got {e.code()}")
    print("ok: no token is UNAUTHENTICATED over TLS")

    init, call = stub.Initialize.with_call(pb.InitializeRequest(
        protocol_version="2025-06-18",
        client_info=pb.Implementation(name="grpc-tls", version="1")), metadata=md, timeout=30)
    session = dict(call.initial_metadata()).get("mcp-session-id")
    assert session, "Initialize returns mcp-session-id"
    md_session = md + [("mcp-session-id", session)]
    tools = stub.ListTools(pb.ListToolsRequest(), metadata=md, timeout=30)
    names = {t.name for t in tools.tools}
    assert "echo_text" in names, names
    r = stub.CallTool(pb.CallToolRequest(name="echo_text", arguments=json.dumps({"text": "tls"}).encode()),
                      metadata=md_session, timeout=30)
    assert not r.is_error and any(c.text.text == "tls" for c in r.content), r
    print("ok: Initialize, ListTools and CallTool over TLS with a bearer token")

    # A channel that does not trust the broker's CA never becomes ready.
    bad = grpc.secure_channel(target, grpc.ssl_channel_credentials(), options=options)
    try:
        grpc.channel_ready_future(bad).result(timeout=3)
        sys.exit("a channel without the CA became ready")
    except grpc.FutureTimeoutError:
        print("ok: a channel without the CA is refused")
    print("grpc tls: ok")


main()
