//! `compute.v1.ComputeService` over a [`Node`]. Handlers read: `into_inner` → domain call →
//! `?` (errors become a Status in `api::status`).

use std::pin::Pin;
use std::time::SystemTime;

use futures::Stream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::api::compute::v1 as pb;
use crate::api::compute::v1::compute_service_server::ComputeService;
use crate::api::convert;
use crate::metrics::observe;
use crate::node::{blocking, Error, Node};

/// ComputeService over a [`Node`].
#[derive(Clone)]
pub struct ComputeApi {
    node: Node,
}

impl ComputeApi {
    /// Serves `node`.
    pub fn new(node: Node) -> Self {
        Self { node }
    }
}

type ExecStream = Pin<Box<dyn Stream<Item = Result<pb::ExecEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ComputeService for ComputeApi {
    #[instrument(skip_all)]
    async fn create_sandbox(
        &self,
        req: Request<pb::CreateSandboxRequest>,
    ) -> Result<Response<pb::CreateSandboxResponse>, Status> {
        observe("CreateSandbox", async move {
            let sb = self
                .node
                .create(convert::create_request(req.into_inner())?)
                .await?;
            Ok(Response::new(pb::CreateSandboxResponse {
                sandbox_id: sb.id.clone(),
                status: pb::SandboxStatus::from(sb.status()) as i32,
                created_at: Some(convert::timestamp(sb.created_at)),
            }))
        })
        .await
    }

    #[instrument(skip_all, fields(sandbox_id = %req.get_ref().sandbox_id))]
    async fn destroy_sandbox(
        &self,
        req: Request<pb::DestroySandboxRequest>,
    ) -> Result<Response<pb::DestroySandboxResponse>, Status> {
        observe("DestroySandbox", async move {
            let (sb, usage) = self.node.destroy(&req.into_inner().sandbox_id).await?;
            Ok(Response::new(pb::DestroySandboxResponse {
                sandbox_id: sb.id.clone(),
                total_usage: Some(usage.into()),
            }))
        })
        .await
    }

    #[instrument(skip_all, fields(sandbox_id = %req.get_ref().sandbox_id))]
    async fn describe_sandbox(
        &self,
        req: Request<pb::DescribeSandboxRequest>,
    ) -> Result<Response<pb::DescribeSandboxResponse>, Status> {
        observe("DescribeSandbox", async move {
            let sb = self.node.get(&req.into_inner().sandbox_id)?;
            let usage = self.node.usage(&sb).await;
            let state = sb.state();
            let uptime = SystemTime::now()
                .duration_since(sb.created_at)
                .unwrap_or_default();
            Ok(Response::new(pb::DescribeSandboxResponse {
                sandbox_id: sb.id.clone(),
                status: pb::SandboxStatus::from(state.status) as i32,
                created_at: Some(convert::timestamp(sb.created_at)),
                current_uptime: Some(convert::duration(uptime)),
                current_usage: Some(usage.into()),
                failure_reason: state.reason,
                tenant_id: sb.tenant_id.clone(),
                session_id: sb.session_id.clone(),
                image: sb.image.clone(),
            }))
        })
        .await
    }

    type ExecCommandStream = ExecStream;

    #[instrument(skip_all, fields(sandbox_id = %req.get_ref().sandbox_id))]
    async fn exec_command(
        &self,
        req: Request<pb::ExecCommandRequest>,
    ) -> Result<Response<Self::ExecCommandStream>, Status> {
        observe("ExecCommand", async move {
            let req = req.into_inner();
            let id = req.sandbox_id.clone();
            let rx = self.node.exec(&id, convert::exec_request(req)?).await?;
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(convert::exec_event);
            let stream: Self::ExecCommandStream = Box::pin(stream);
            Ok(Response::new(stream))
        })
        .await
    }

    #[instrument(skip_all, fields(sandbox_id = %req.get_ref().sandbox_id))]
    async fn read_file(
        &self,
        req: Request<pb::ReadFileRequest>,
    ) -> Result<Response<pb::ReadFileResponse>, Status> {
        observe("ReadFile", async move {
            let req = req.into_inner();
            let (_, ws) = self.node.workspace(&req.sandbox_id).await?;
            let r = blocking(move || ws.read(&req.path, req.offset, req.max_bytes))
                .await?
                .map_err(Error::from)?;
            Ok(Response::new(pb::ReadFileResponse {
                data: r.data,
                total_size: r.total_size as i64,
                eof: r.eof,
            }))
        })
        .await
    }

    #[instrument(skip_all, fields(sandbox_id = %req.get_ref().sandbox_id))]
    async fn write_file(
        &self,
        req: Request<pb::WriteFileRequest>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        observe("WriteFile", async move {
            let req = req.into_inner();
            let (_, ws) = self.node.workspace(&req.sandbox_id).await?;
            self.node.check_free_disk().await?;
            let n = blocking(move || ws.write(&req.path, &req.data, req.append, req.mode))
                .await?
                .map_err(Error::from)?;
            Ok(Response::new(pb::WriteFileResponse {
                bytes_written: n as i64,
            }))
        })
        .await
    }

    #[instrument(skip_all, fields(sandbox_id = %req.get_ref().sandbox_id))]
    async fn list_files(
        &self,
        req: Request<pb::ListFilesRequest>,
    ) -> Result<Response<pb::ListFilesResponse>, Status> {
        observe("ListFiles", async move {
            let req = req.into_inner();
            let (_, ws) = self.node.workspace(&req.sandbox_id).await?;
            let (entries, truncated) =
                blocking(move || ws.list(&req.path, req.recursive, req.max_entries))
                    .await?
                    .map_err(Error::from)?;
            Ok(Response::new(pb::ListFilesResponse {
                entries: entries.into_iter().map(Into::into).collect(),
                truncated,
            }))
        })
        .await
    }
}
