//! Serving: ComputeService on TCP and on a unix socket, plus gRPC health and reflection.

use std::path::Path;
use std::time::Duration;

use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tracing::{info, warn};

use crate::api::compute::v1::compute_service_server::ComputeServiceServer;
use crate::api::services::{AdminService, ComputeApi, InfoApi};
use crate::api::FILE_DESCRIPTOR_SET;
use crate::node::Node;

/// Errors of serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A listener could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address or path.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// The TLS files could not be read.
    #[error("tls: {0}")]
    Tls(String),
    /// Reflection could not be built.
    #[error("reflection: {0}")]
    Reflection(String),
    /// The server failed.
    #[error("serve: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The platform API's store could not be opened.
    #[error("platform store: {0}")]
    Platform(String),
}

/// ComputeService's name as gRPC health reports it.
const COMPUTE_SERVICE: &str =
    <ComputeServiceServer<ComputeApi> as tonic::server::NamedService>::NAME;

/// Largest gRPC message accepted or sent: a 16 MiB WriteFile plus framing.
pub const MAX_MESSAGE: usize = 17 << 20;

/// Server reflection, v1 and v1alpha (grpcurl 1.8 asks v1alpha), over every proto we serve
/// (the node's and the router's: compute.v1, health, the platform API).
#[allow(clippy::type_complexity)]
pub fn reflection() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    Error,
> {
    let sets = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(crate::platform::service::FILE_DESCRIPTOR_SET)
    };
    let v1 = sets()
        .build_v1()
        .map_err(|e| Error::Reflection(e.to_string()))?;
    let v1alpha = sets()
        .build_v1alpha()
        .map_err(|e| Error::Reflection(e.to_string()))?;
    Ok((v1, v1alpha))
}

/// Serves the node until `shutdown` resolves; then cancels the node's tasks (in-flight execs
/// end as cancelled) and returns once the listeners have finished their calls. The caller
/// drains the node's tasks ([`Node::shutdown`]).
pub async fn serve(
    node: Node,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let cfg = node.config().clone();
    let node_token = node.tasks().token().clone();
    let (reporter, health) = tonic_health::server::health_reporter();
    // Health follows containerd: SERVING while it answers.
    {
        let node = node.clone();
        node.clone().tasks().spawn(async move {
            let mut last = None;
            loop {
                let ok = node.runtime().version().await.is_ok();
                // The HTTP probes (`/readyz` on the metrics listener) answer the same.
                crate::metrics::METRICS.set_serving(ok);
                if last != Some(ok) {
                    use tonic_health::ServingStatus::{NotServing, Serving};
                    if !ok {
                        warn!("containerd is not answering: health NOT_SERVING");
                    }
                    let status = if ok { Serving } else { NotServing };
                    // The server as a whole (""), ComputeService and the platform's services
                    // by name.
                    let names = ["", COMPUTE_SERVICE]
                        .into_iter()
                        .chain(crate::platform::service::SERVICES);
                    for name in names {
                        reporter.set_service_status(name, status).await;
                    }
                    last = Some(ok);
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
    }
    let (reflection_v1, reflection_v1alpha) = reflection()?;
    let info =
        crate::api::node::v1::node_info_server::NodeInfoServer::new(InfoApi::new(node.clone()));
    let relay = crate::relay::service::RelayService::new(node.relay().clone());
    // The relay carries the same payloads as ComputeService (stdin, collected stdout): the
    // same message cap, not tonic's 4 MiB default.
    let relay_worker =
        crate::api::sandbox::v1::sandbox_worker_server::SandboxWorkerServer::new(relay.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
    let relay_exec = crate::api::sandbox::v1::sandbox_exec_server::SandboxExecServer::new(relay)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let admin = crate::api::admin::v1::node_admin_server::NodeAdminServer::new(AdminService::new(
        node.clone(),
    ));
    let svc = ComputeServiceServer::new(ComputeApi::new(node.clone()))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    // The platform API, its records in this node's embedded store, its sandboxes this node's.
    let platform = crate::platform::service::Platform::embedded(
        cfg.state_dir.join("platform").join("platform.redb"),
    )
    .await
    .map_err(|e| Error::Platform(e.to_string()))?;
    let platform = if cfg.platform_peer_secret.as_os_str().is_empty() {
        platform
    } else {
        let secret = crate::platform::keys::read_secret(&cfg.platform_peer_secret)
            .map_err(|e| Error::Platform(e.to_string()))?;
        platform.with_peer_secret(&secret)
    }
    .with_sandboxes(crate::platform::sandboxes::Backend::Node(node))
    .servers();

    // One set of services, served twice: on TCP (TLS when configured; NodeAdmin only with
    // admin_tcp) and on the unix socket (plain, always with NodeAdmin).
    // Flow-control windows sized for WriteFile/ReadFile's 16 MiB messages: with HTTP/2's
    // default 64 KiB a 16 MiB message waits for hundreds of WINDOW_UPDATE round trips.
    let routes = |server: Server| {
        server
            .initial_stream_window_size(Some(WINDOW))
            .initial_connection_window_size(Some(2 * WINDOW))
            // 1 MiB frames: a 16 MiB message in 16 frames, not 1024.
            .max_frame_size(Some(1 << 20))
            .layer(tower::util::MapResponseLayer::new(
                undecodable_is_invalid_argument as fn(_) -> _,
            ))
            .add_service(health.clone())
            .add_service(reflection_v1.clone())
            .add_service(reflection_v1alpha.clone())
            .add_service(info.clone())
            .add_service(relay_worker.clone())
            .add_service(relay_exec.clone())
            .add_service(svc.clone())
            .add_service(platform.sandbox.clone())
            .add_service(platform.access.clone())
            .add_service(platform.environment.clone())
            .add_service(platform.workspace.clone())
    };
    let tcp_server = match tls_config(&cfg)? {
        Some(tls) => {
            info!(
                client_auth = !cfg.tls_client_ca.as_os_str().is_empty(),
                "TCP listener uses TLS"
            );
            Server::builder()
                .tls_config(tls)
                .map_err(|e| Error::Tls(e.to_string()))?
        }
        None => Server::builder(),
    };
    let tcp_router = if cfg.admin_tcp {
        routes(tcp_server).add_service(admin.clone())
    } else {
        routes(tcp_server)
    };
    let with_admin = routes(Server::builder()).add_service(admin);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };

    // The listeners are this function's own tasks: joined below, stopped on `shutdown`.
    let mut listeners = tokio::task::JoinSet::new();
    if !cfg.listen.is_empty() {
        let l = tokio::net::TcpListener::bind(&cfg.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: cfg.listen.clone(),
                source,
            })?;
        info!(addr = %cfg.listen, "serving ComputeService on TCP");
        let r = tcp_router;
        let rx = stop_rx.clone();
        listeners.spawn(async move {
            r.serve_with_incoming_shutdown(tcp_incoming(l), stopped(rx))
                .await
        });
    }
    if !cfg.socket.as_os_str().is_empty() {
        let l = bind_unix(&cfg.socket, &cfg.socket_group)?;
        info!(path = %cfg.socket.display(), "serving ComputeService and NodeAdmin on unix socket");
        let r = with_admin;
        let rx = stop_rx.clone();
        listeners.spawn(async move {
            r.serve_with_incoming_shutdown(UnixListenerStream::new(l), stopped(rx))
                .await
        });
    }
    let mut shutdown = std::pin::pin!(shutdown);
    let mut result = Ok(());
    loop {
        tokio::select! {
            _ = &mut shutdown, if !*stop_tx.borrow() => {
                // In-flight execs end as cancelled (their streams then close), and the
                // listeners stop taking calls and finish the ones under way.
                node_token.cancel();
                let _ = stop_tx.send(true);
            }
            done = listeners.join_next() => match done {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => {
                    result = Err(e.into());
                    let _ = stop_tx.send(true);
                }
                Some(Err(e)) => warn!(error = %e, "server task failed"),
            }
        }
    }
    result
}

/// The TCP listener's TLS settings: none without `tls_cert`; with `tls_client_ca`, client
/// certificates signed by that CA are required (tonic rejects a handshake without one).
pub fn tls_config(cfg: &crate::config::Config) -> Result<Option<ServerTlsConfig>, Error> {
    tls_files(&cfg.tls_cert, &cfg.tls_key, &cfg.tls_client_ca)
}

/// A TCP listener's TLS settings from PEM files (the node's and the router's): none when `cert`
/// is empty; with a non-empty `client_ca`, client certificates signed by it are required
/// (mutual TLS). The files are read here; their contents are checked by
/// [`check_server_tls`] or when the server starts.
pub fn tls_files(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
) -> Result<Option<ServerTlsConfig>, Error> {
    if cert.as_os_str().is_empty() {
        return Ok(None);
    }
    let read = |p: &Path| std::fs::read(p).map_err(|e| Error::Tls(format!("{}: {e}", p.display())));
    let identity = Identity::from_pem(read(cert)?, read(key)?);
    let mut tls = ServerTlsConfig::new().identity(identity);
    if !client_ca.as_os_str().is_empty() {
        tls = tls
            .client_ca_root(Certificate::from_pem(read(client_ca)?))
            .client_auth_optional(false);
    }
    Ok(Some(tls))
}

/// Builds the TLS acceptor of `tls` once, so that a certificate or key that does not parse (or
/// a key that does not match its certificate) is an error before any port is bound, not at the
/// first handshake.
pub fn check_server_tls(tls: &ServerTlsConfig) -> Result<(), Error> {
    Server::builder()
        .tls_config(tls.clone())
        .map(|_| ())
        .map_err(|e| Error::Tls(error_chain(&e)))
}

/// An error and its sources on one line, each message once (tonic's transport errors say
/// "transport error" at the top and repeat their causes' messages).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(c) = next {
        let m = c.to_string();
        if !parts.iter().any(|p| p.contains(&m)) {
            // A cause that repeats the message above it with more detail replaces it.
            match parts.last_mut() {
                Some(last) if m.contains(last.as_str()) => *last = m,
                _ => parts.push(m),
            }
        }
        next = c.source();
    }
    parts.join(": ")
}

/// A request that does not decode (e.g. a string field holding invalid UTF-8) is the caller's
/// error: tonic answers INTERNAL, as gRPC's table does for parse errors; we answer
/// INVALID_ARGUMENT, the code our API gives every other malformed input. A request over the
/// message size cap is RESOURCE_EXHAUSTED, as gRPC specifies; tonic answers OUT_OF_RANGE.
fn undecodable_is_invalid_argument(
    mut resp: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let h = resp.headers();
    let status = h.get("grpc-status").and_then(|v| v.to_str().ok());
    let message = h
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .replace("%20", " ");
    let new = match status {
        Some("13") if message.starts_with("failed to decode") => Some("3"),
        Some("11") if message.starts_with("Error, decoded message length too large") => Some("8"),
        _ => None,
    };
    if let Some(code) = new {
        resp.headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static(code));
    }
    resp
}

pub(crate) fn bind_unix(path: &Path, group: &str) -> Result<tokio::net::UnixListener, Error> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| Error::Bind {
        addr: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let l = tokio::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(err)?;
    if !group.is_empty() {
        let gid = match group.parse::<u32>() {
            Ok(g) => g,
            Err(_) => nix::unistd::Group::from_name(group)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
                .ok_or_else(|| err(std::io::Error::other(format!("no group {group:?}"))))?,
        };
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(err)?;
    }
    Ok(l)
}

/// Accepted connections with `TCP_NODELAY`: an exec's stream ends with small frames (the last
/// event, then trailers) that Nagle's algorithm would hold for the client's delayed ACK
/// (~40 ms here).
pub fn tcp_incoming(l: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true))
}

/// The HTTP/2 flow-control window of a stream (the connection's is twice this). Clients that
/// move files should use the same (`Endpoint::initial_stream_window_size`).
pub const WINDOW: u32 = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);

    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    fn chain(msgs: &[&'static str]) -> E {
        msgs.iter()
            .rev()
            .fold(None, |src, m| Some(E(m, src.map(Box::new))))
            .unwrap()
    }

    #[test]
    fn error_chains_say_each_thing_once() {
        for (msgs, want) in [
            (&["a"][..], "a"),
            (
                &["transport error", "transport error", "refused"][..],
                "transport error: refused",
            ),
            (
                &["tcp connect error", "tcp connect error: refused"][..],
                "tcp connect error: refused",
            ),
            (
                &["x: bad cert", "transport error", "bad cert"][..],
                "x: bad cert: transport error",
            ),
        ] {
            assert_eq!(error_chain(&chain(msgs)), want, "{msgs:?}");
        }
    }
}
