//! Dialing a gRPC server on a unix socket (the node's socket, containerd's): the one connector
//! the daemon, computectl and the tests use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

fn endpoint() -> Endpoint {
    // The authority is a placeholder: the connector below ignores it and dials the socket.
    Endpoint::from_static("http://[::]").connect_timeout(Duration::from_secs(5))
}

fn connector(
    path: PathBuf,
) -> impl tower::Service<
    http::Uri,
    Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>,
    Error = std::io::Error,
    Future = impl std::future::Future<
        Output = std::io::Result<hyper_util::rt::TokioIo<tokio::net::UnixStream>>,
    > + Send,
> + Clone {
    tower::service_fn(move |_: http::Uri| {
        let p = path.clone();
        async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(p).await?,
            ))
        }
    })
}

/// A channel to the server on the unix socket at `path`, connected now.
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    endpoint()
        .connect_with_connector(connector(path.to_path_buf()))
        .await
}

/// A channel to the server on the unix socket at `path` that connects on first use and
/// reconnects after the server restarts (calls made while it is down fail with UNAVAILABLE).
pub fn lazy_unix_channel(path: &Path) -> Channel {
    endpoint().connect_with_connector_lazy(connector(path.to_path_buf()))
}
