//! A tonic client of the broker's gRPC edge, for the tests that drive it
//! beside the other edges.

use mcp_proto::v1 as pb;
use pb::mcp_service_client::McpServiceClient;
use tonic::transport::Channel;

/// A current-thread tokio runtime for the gRPC client.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A client connected to the gRPC edge of `b`.
pub async fn client(b: &super::Broker) -> McpServiceClient<Channel> {
    let ch = Channel::from_shared(format!("http://{}", b.grpc))
        .unwrap()
        .connect()
        .await
        .expect("connecting to the gRPC edge");
    McpServiceClient::new(ch)
}

/// `m` carrying session `session` in its metadata.
pub fn with_session<T>(m: T, session: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(m);
    r.metadata_mut()
        .insert(mcp_proto::SESSION_METADATA_KEY, session.parse().unwrap());
    r
}

/// Initializes a session (client name `name`) and returns its id.
pub async fn initialize(g: &mut McpServiceClient<Channel>, name: &str) -> String {
    let init = g
        .initialize(pb::InitializeRequest {
            protocol_version: "2025-06-18".into(),
            capabilities: Some(pb::ClientCapabilities::default()),
            client_info: Some(pb::Implementation {
                name: name.into(),
                version: "1".into(),
                ..Default::default()
            }),
        })
        .await
        .expect("Initialize");
    init.metadata()
        .get(mcp_proto::SESSION_METADATA_KEY)
        .expect("Initialize answers a session id")
        .to_str()
        .unwrap()
        .to_string()
}
