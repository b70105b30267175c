//! ComputeService on the router: every call forwarded to the owning node (the unary ones
//! written out by one macro, `forward!`), and the router's own health and reflection; the
//! sandbox.v1 relay is forwarded by [`RelayForwarder`].

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};
use tracing::info;

pub use super::relay::RelayForwarder;
use super::{Error, NodeEndpoint, Router};
use crate::api::compute::v1 as pb;
use crate::api::compute::v1::compute_service_server::{ComputeService, ComputeServiceServer};
use crate::metrics::observe;

/// ComputeService forwarding over a [`Router`].
#[derive(Clone)]
pub struct Forwarder {
    r: Router,
}

impl Forwarder {
    /// Forwards through `r`.
    pub fn new(r: Router) -> Self {
        Self { r }
    }

    /// Passes a node's answer through; a transport failure marks the node down.
    fn pass<T>(
        &self,
        n: &NodeEndpoint,
        r: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        match r {
            Ok(resp) => Ok(Response::new(resp.into_inner())),
            Err(s) => {
                self.r.node_failed(n, &s);
                Err(Error::Node(s).into())
            }
        }
    }
}

type ExecStream = Pin<Box<dyn Stream<Item = Result<pb::ExecEvent, Status>> + Send>>;

/// Implements ComputeService for [`Forwarder`]. Each call in `unary` goes, as it is, to the
/// node owning its `sandbox_id`, and the node's answer comes back through [`Forwarder::pass`],
/// recorded under the RPC name given; the items after it are written out as they are.
macro_rules! forward {
    (
        unary {
            $($call:ident($req:ty) -> $resp:ty as $rpc:literal;)*
        }
        $($rest:tt)*
    ) => {
        #[tonic::async_trait]
        impl ComputeService for Forwarder {
            $(
                async fn $call(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    observe($rpc, async move {
                        let req = req.into_inner();
                        let n = self.r.owner(&req.sandbox_id).await?;
                        let r = self.r.client(&n)?.$call(req).await;
                        self.pass(&n, r)
                    })
                    .await
                }
            )*

            $($rest)*
        }
    };
}

forward! {
    unary {
        destroy_sandbox(pb::DestroySandboxRequest) -> pb::DestroySandboxResponse
            as "DestroySandbox";
        describe_sandbox(pb::DescribeSandboxRequest) -> pb::DescribeSandboxResponse
            as "DescribeSandbox";
        read_file(pb::ReadFileRequest) -> pb::ReadFileResponse as "ReadFile";
        write_file(pb::WriteFileRequest) -> pb::WriteFileResponse as "WriteFile";
        list_files(pb::ListFilesRequest) -> pb::ListFilesResponse as "ListFiles";
    }

    async fn create_sandbox(
        &self,
        req: Request<pb::CreateSandboxRequest>,
    ) -> Result<Response<pb::CreateSandboxResponse>, Status> {
        observe("CreateSandbox", async move {
            Ok(Response::new(self.r.create(req.into_inner()).await?))
        })
        .await
    }

    type ExecCommandStream = ExecStream;

    async fn exec_command(
        &self,
        req: Request<pb::ExecCommandRequest>,
    ) -> Result<Response<Self::ExecCommandStream>, Status> {
        observe("ExecCommand", async move {
            let req = req.into_inner();
            let n = self.r.owner(&req.sandbox_id).await?;
            let r = self.r.client(&n)?.exec_command(req).await;
            // Dropping the returned stream (the caller went away) drops the node's stream,
            // which cancels the exec on the node.
            let upstream = self.pass(&n, r)?.into_inner();
            let stream: ExecStream = Box::pin(upstream);
            Ok(Response::new(stream))
        })
        .await
    }
}

/// Where and how the router serves.
pub struct Listeners {
    /// TCP address (e.g. `0.0.0.0:50051`).
    pub listen: String,
    /// The TCP listener's TLS (from [`super::tls::listener`]): over TLS and, if it names a
    /// client CA, only to callers with a certificate from it.
    pub tls: Option<ServerTlsConfig>,
    /// A unix socket (0660) serving the same; uid 0 on it is the platform API's admin
    /// (`local-root`), which is how the first namespace and key of a cluster are made
    /// (`kubectl exec` into a router pod, then `computectl --socket`). `None`: no socket.
    pub socket: Option<std::path::PathBuf>,
}

/// Serves the router until `shutdown` resolves: ComputeService, the sandbox.v1 relay, the
/// platform API over `platform`'s records, health (the server and ComputeService SERVING while
/// at least one node is ready; the platform's services, served from their store, SERVING) and
/// reflection, on TCP and on the unix socket of `at`.
pub async fn serve(
    r: Router,
    at: Listeners,
    platform: crate::platform::service::Platform,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), crate::server::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in crate::platform::service::SERVICES {
        reporter
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    {
        let r2 = r.clone();
        r.tasks().spawn(async move {
            let r = r2;
            let mut last = None;
            loop {
                let ok = !r.ready_nodes().is_empty();
                // The HTTP probes (`/readyz` on the metrics listener) answer the same.
                crate::metrics::METRICS.set_serving(ok);
                if last != Some(ok) {
                    let st = if ok {
                        tonic_health::ServingStatus::Serving
                    } else {
                        tonic_health::ServingStatus::NotServing
                    };
                    reporter.set_service_status("", st).await;
                    reporter
                        .set_service_status("compute.v1.ComputeService", st)
                        .await;
                    last = Some(ok);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
    let (v1, v1alpha) = crate::server::reflection()?;
    let relay = RelayForwarder::new(r.clone());
    let svc = ComputeServiceServer::new(Forwarder::new(r))
        .max_decoding_message_size(crate::server::MAX_MESSAGE)
        .max_encoding_message_size(crate::server::MAX_MESSAGE);
    let worker =
        crate::api::sandbox::v1::sandbox_worker_server::SandboxWorkerServer::new(relay.clone())
            .max_decoding_message_size(crate::server::MAX_MESSAGE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE);
    let exec = crate::api::sandbox::v1::sandbox_exec_server::SandboxExecServer::new(relay)
        .max_decoding_message_size(crate::server::MAX_MESSAGE)
        .max_encoding_message_size(crate::server::MAX_MESSAGE);
    let p = platform.servers();
    let routes = |mut server: Server| {
        server
            .add_service(health.clone())
            .add_service(v1.clone())
            .add_service(v1alpha.clone())
            .add_service(worker.clone())
            .add_service(exec.clone())
            .add_service(svc.clone())
            .add_service(p.sandbox.clone())
            .add_service(p.access.clone())
            .add_service(p.environment.clone())
            .add_service(p.workspace.clone())
    };
    let tls_on = at.tls.is_some();
    let tcp = match at.tls {
        Some(tls) => Server::builder()
            .tls_config(tls)
            .map_err(|e| crate::server::Error::Tls(e.to_string()))?,
        None => Server::builder(),
    };
    let l = tokio::net::TcpListener::bind(&at.listen)
        .await
        .map_err(|source| crate::server::Error::Bind {
            addr: at.listen.clone(),
            source,
        })?;
    info!(addr = %at.listen, tls = tls_on, "router serving ComputeService and the platform API");
    let unix = match &at.socket {
        Some(path) => {
            let u = crate::server::bind_unix(path, "")?;
            info!(path = %path.display(), "router serving on unix socket (uid 0 is platform admin)");
            Some(u)
        }
        None => None,
    };
    // One shutdown for both listeners: each finishes the calls under way.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let tcp = routes(tcp)
        .serve_with_incoming_shutdown(crate::server::tcp_incoming(l), stopped(stop_rx.clone()));
    let socket = async {
        match unix {
            Some(u) => {
                routes(Server::builder())
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(u),
                        stopped(stop_rx.clone()),
                    )
                    .await
            }
            None => Ok(()),
        }
    };
    let signal = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        Ok::<(), tonic::transport::Error>(())
    };
    tokio::try_join!(tcp, socket, signal)?;
    Ok(())
}
