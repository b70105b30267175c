//! The sandbox.v1 relay through the router: every call goes to the node that hosts the
//! sandbox's worker ([`Router::relay_node`]), carrying the caller's `authorization`; a worker's
//! Attach stream is proxied both ways.

use std::pin::Pin;

use futures::Stream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::{NodeEndpoint, Router};
use crate::api::sandbox::v1 as sb;
use crate::api::sandbox::v1::sandbox_exec_client::SandboxExecClient;
use crate::api::sandbox::v1::sandbox_worker_client::SandboxWorkerClient;
use crate::server::MAX_MESSAGE;

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

    fn worker_client(&self, n: &NodeEndpoint) -> Result<SandboxWorkerClient<Channel>, Status> {
        Ok(SandboxWorkerClient::new(self.r.node_channel(n)?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE))
    }

    /// The exec client of the node hosting `sandbox_id`'s relay.
    async fn exec_client(&self, sandbox_id: &str) -> Result<SandboxExecClient<Channel>, Status> {
        let n = self.r.relay_node(sandbox_id).await?;
        Ok(SandboxExecClient::new(self.r.node_channel(&n)?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE))
    }
}

type FrameStream = Pin<Box<dyn Stream<Item = Result<sb::ServerFrame, Status>> + Send>>;
type RelayEventStream = Pin<Box<dyn Stream<Item = Result<sb::ExecEvent, Status>> + Send>>;

/// A request to a node carrying the caller's `authorization` metadata (the worker's
/// credential, which only the node checks; never logged here).
fn with_authorization<T>(from: &tonic::metadata::MetadataMap, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(v) = from.get("authorization") {
        r.metadata_mut().insert("authorization", v.clone());
    }
    r
}

/// The caller's request as it goes on to the node (see [`with_authorization`]).
fn onward<T>(req: Request<T>) -> Request<T> {
    let metadata = req.metadata().clone();
    with_authorization(&metadata, req.into_inner())
}

#[tonic::async_trait]
impl sb::sandbox_worker_server::SandboxWorker for RelayForwarder {
    type AttachStream = FrameStream;

    async fn attach(
        &self,
        req: Request<tonic::Streaming<sb::WorkerFrame>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
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
        self.r.tasks().spawn(async move {
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

#[tonic::async_trait]
impl sb::sandbox_exec_server::SandboxExec for RelayForwarder {
    type ExecStream = RelayEventStream;

    async fn exec(
        &self,
        req: Request<sb::ExecRequest>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let mut c = self.exec_client(&req.get_ref().sandbox_id).await?;
        let s = c.exec(onward(req)).await?.into_inner();
        Ok(Response::new(Box::pin(s)))
    }

    async fn abort(
        &self,
        req: Request<sb::AbortRequest>,
    ) -> Result<Response<sb::AbortResponse>, Status> {
        let mut c = self.exec_client(&req.get_ref().sandbox_id).await?;
        Ok(Response::new(c.abort(onward(req)).await?.into_inner()))
    }
}
