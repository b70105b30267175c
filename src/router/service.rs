//! ComputeService on the router: every call forwarded to the owning node, and the router's own
//! health and reflection.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};
use tracing::info;

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

#[tonic::async_trait]
impl ComputeService for Forwarder {
    async fn create_sandbox(
        &self,
        req: Request<pb::CreateSandboxRequest>,
    ) -> Result<Response<pb::CreateSandboxResponse>, Status> {
        observe("CreateSandbox", async move {
            Ok(Response::new(self.r.create(req.into_inner()).await?))
        })
        .await
    }

    async fn destroy_sandbox(
        &self,
        req: Request<pb::DestroySandboxRequest>,
    ) -> Result<Response<pb::DestroySandboxResponse>, Status> {
        observe("DestroySandbox", async move {
            let req = req.into_inner();
            let n = self.r.owner(&req.sandbox_id).await?;
            let r = self.r.client(&n)?.destroy_sandbox(req).await;
            self.pass(&n, r)
        })
        .await
    }

    async fn describe_sandbox(
        &self,
        req: Request<pb::DescribeSandboxRequest>,
    ) -> Result<Response<pb::DescribeSandboxResponse>, Status> {
        observe("DescribeSandbox", async move {
            let req = req.into_inner();
            let n = self.r.owner(&req.sandbox_id).await?;
            let r = self.r.client(&n)?.describe_sandbox(req).await;
            self.pass(&n, r)
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

    async fn read_file(
        &self,
        req: Request<pb::ReadFileRequest>,
    ) -> Result<Response<pb::ReadFileResponse>, Status> {
        observe("ReadFile", async move {
            let req = req.into_inner();
            let n = self.r.owner(&req.sandbox_id).await?;
            let r = self.r.client(&n)?.read_file(req).await;
            self.pass(&n, r)
        })
        .await
    }

    async fn write_file(
        &self,
        req: Request<pb::WriteFileRequest>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        observe("WriteFile", async move {
            let req = req.into_inner();
            let n = self.r.owner(&req.sandbox_id).await?;
            let r = self.r.client(&n)?.write_file(req).await;
            self.pass(&n, r)
        })
        .await
    }

    async fn list_files(
        &self,
        req: Request<pb::ListFilesRequest>,
    ) -> Result<Response<pb::ListFilesResponse>, Status> {
        observe("ListFiles", async move {
            let req = req.into_inner();
            let n = self.r.owner(&req.sandbox_id).await?;
            let r = self.r.client(&n)?.list_files(req).await;
            self.pass(&n, r)
        })
        .await
    }
}

/// Serves the router on `listen` until `shutdown` resolves: ComputeService, the sandbox.v1
/// relay, health (SERVING while at least one node is ready) and reflection; with `tls` (from
/// [`super::tls::listener`]), over TLS and, if it names a client CA, only to callers with a
/// certificate from it.
pub async fn serve(
    r: Router,
    listen: &str,
    tls: Option<ServerTlsConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), crate::server::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    {
        let r = r.clone();
        tokio::spawn(async move {
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
    let tls_on = tls.is_some();
    let mut server = match tls {
        Some(tls) => Server::builder()
            .tls_config(tls)
            .map_err(|e| crate::server::Error::Tls(e.to_string()))?,
        None => Server::builder(),
    };
    let l = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| crate::server::Error::Bind {
            addr: listen.to_string(),
            source,
        })?;
    info!(addr = %listen, tls = tls_on, "router serving ComputeService");
    server
        .add_service(health)
        .add_service(v1)
        .add_service(v1alpha)
        .add_service(
            crate::api::sandbox::v1::sandbox_worker_server::SandboxWorkerServer::new(relay.clone())
                .max_decoding_message_size(crate::server::MAX_MESSAGE)
                .max_encoding_message_size(crate::server::MAX_MESSAGE),
        )
        .add_service(
            crate::api::sandbox::v1::sandbox_exec_server::SandboxExecServer::new(relay)
                .max_decoding_message_size(crate::server::MAX_MESSAGE)
                .max_encoding_message_size(crate::server::MAX_MESSAGE),
        )
        .add_service(svc)
        .serve_with_incoming_shutdown(crate::server::tcp_incoming(l), shutdown)
        .await?;
    Ok(())
}

/// The sandbox.v1 relay through the router: every call goes to the node that hosts the
/// sandbox's worker ([`Router::relay_node`]); a worker's Attach stream is proxied both ways.
#[derive(Clone)]
pub struct RelayForwarder {
    r: Router,
}

impl RelayForwarder {
    /// Forwards through `r`.
    pub fn new(r: Router) -> Self {
        Self { r }
    }
}

type FrameStream =
    Pin<Box<dyn Stream<Item = Result<crate::api::sandbox::v1::ServerFrame, Status>> + Send>>;
type RelayEventStream =
    Pin<Box<dyn Stream<Item = Result<crate::api::sandbox::v1::ExecEvent, Status>> + Send>>;

/// A request to a node carrying the caller's `authorization` metadata (the worker's
/// credential, which only the node checks; never logged here).
fn with_authorization<T>(from: &tonic::metadata::MetadataMap, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(v) = from.get("authorization") {
        r.metadata_mut().insert("authorization", v.clone());
    }
    r
}

#[tonic::async_trait]
impl crate::api::sandbox::v1::sandbox_worker_server::SandboxWorker for RelayForwarder {
    type AttachStream = FrameStream;

    async fn attach(
        &self,
        req: Request<tonic::Streaming<crate::api::sandbox::v1::WorkerFrame>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        use crate::api::sandbox::v1 as sb;
        let metadata = req.metadata().clone();
        let mut frames = req.into_inner();
        // The Hello names the sandbox, and so the node.
        let first = frames
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the first frame must be Hello"))?;
        let id = match &first.msg {
            Some(sb::worker_frame::Msg::Hello(h)) if !h.sandbox_id.is_empty() => {
                h.sandbox_id.clone()
            }
            _ => return Err(Status::invalid_argument("the first frame must be Hello")),
        };
        let n = self.r.relay_node(&id).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let _ = tx.send(first).await;
        tokio::spawn(async move {
            while let Ok(Some(m)) = frames.message().await {
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        });
        let upstream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let down = self
            .worker_client(&n)?
            .attach(with_authorization(&metadata, upstream))
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(down)))
    }
}

impl RelayForwarder {
    fn worker_client(
        &self,
        n: &NodeEndpoint,
    ) -> Result<
        crate::api::sandbox::v1::sandbox_worker_client::SandboxWorkerClient<
            tonic::transport::Channel,
        >,
        Status,
    > {
        Ok(
            crate::api::sandbox::v1::sandbox_worker_client::SandboxWorkerClient::new(
                self.r.node_channel(n)?,
            )
            .max_decoding_message_size(crate::server::MAX_MESSAGE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE),
        )
    }

    fn exec_client(
        &self,
        n: &NodeEndpoint,
    ) -> Result<
        crate::api::sandbox::v1::sandbox_exec_client::SandboxExecClient<tonic::transport::Channel>,
        Status,
    > {
        Ok(
            crate::api::sandbox::v1::sandbox_exec_client::SandboxExecClient::new(
                self.r.node_channel(n)?,
            )
            .max_decoding_message_size(crate::server::MAX_MESSAGE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE),
        )
    }
}

#[tonic::async_trait]
impl crate::api::sandbox::v1::sandbox_exec_server::SandboxExec for RelayForwarder {
    type ExecStream = RelayEventStream;

    async fn exec(
        &self,
        req: Request<crate::api::sandbox::v1::ExecRequest>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let metadata = req.metadata().clone();
        let req = req.into_inner();
        let n = self.r.relay_node(&req.sandbox_id).await?;
        let s = self
            .exec_client(&n)?
            .exec(with_authorization(&metadata, req))
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(s)))
    }

    async fn abort(
        &self,
        req: Request<crate::api::sandbox::v1::AbortRequest>,
    ) -> Result<Response<crate::api::sandbox::v1::AbortResponse>, Status> {
        let metadata = req.metadata().clone();
        let req = req.into_inner();
        let n = self.r.relay_node(&req.sandbox_id).await?;
        Ok(Response::new(
            self.exec_client(&n)?
                .abort(with_authorization(&metadata, req))
                .await?
                .into_inner(),
        ))
    }
}
